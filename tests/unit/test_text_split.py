"""Sentence splitting and chunk planning."""

from __future__ import annotations

import pytest

from voxcast.text.split import plan_chunks, split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello world. How are you? Fine!", ["Hello world.", "How are you?", "Fine!"]),
        ("Pi is 3.14 today. Version 2.0.1 ships.", ["Pi is 3.14 today.", "Version 2.0.1 ships."]),
        ("It costs $1,234.56. Pay now.", ["It costs $1,234.56.", "Pay now."]),
        (
            "Dr. Smith met J. R. R. Tolkien. Mr. Brown, e.g. Bob, too.",
            ["Dr. Smith met J. R. R. Tolkien.", "Mr. Brown, e.g. Bob, too."],
        ),
        (
            "Dr. Smith arrived at 3 p.m. on Monday. The U.S.A. team scored 3.5 points. Next.",
            ["Dr. Smith arrived at 3 p.m. on Monday.", "The U.S.A. team scored 3.5 points.", "Next."],
        ),
        ("Press No. 5 now. I said no. Go.", ["Press No. 5 now.", "I said no.", "Go."]),
        ('He said "stop." Then he left.', ['He said "stop."', "Then he left."]),
        ("Wait... and then? Nothing… Really?!", ["Wait... and then?", "Nothing…", "Really?!"]),
        ("你好。今天天气很好！你去哪里？", ["你好。", "今天天气很好！", "你去哪里？"]),
        ("「走吧。」他说。", ["「走吧。」", "他说。"]),
        ("こんにちは。元気ですか？", ["こんにちは。", "元気ですか？"]),
        ("¿Dónde está? ¡Aquí! Vale.", ["¿Dónde está?", "¡Aquí!", "Vale."]),
        ("Guten Tag. Das ist z.B. gut. Ende.", ["Guten Tag.", "Das ist z.B. gut.", "Ende."]),
        ("Heading\n\nBody text here. More", ["Heading", "Body text here.", "More"]),
        ("no terminator at all", ["no terminator at all"]),
        ("", []),
        ("   \n ", []),
    ],
)
def test_sentence_boundaries(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_long_sentences_fall_back_to_clauses_then_spaces() -> None:
    text = "First clause here, second clause is here; third one: and a long tail of words without any commas at all."
    pieces = split_sentences(text, max_chars=40)
    assert all(len(p) <= 40 for p in pieces)
    assert pieces == [
        "First clause here,",  # + " second clause is here;" would be 41 characters
        "second clause is here; third one:",
        "and a long tail of words without any",  # no clause mark left: cut at spaces
        "commas at all.",
    ]
    assert " ".join(pieces).split() == text.split()  # nothing lost or reordered


def test_cjk_long_sentence_uses_cjk_commas_then_hard_cuts() -> None:
    text = "这是一个很长的句子，包含很多个分句，每个分句都不太长，但是整体超过了限制。"
    pieces = split_sentences(text, max_chars=12)
    assert all(len(p) <= 12 for p in pieces)
    assert "".join(pieces) == text
    assert pieces[0].endswith("，")
    unbroken = "一二三四五六七八九十" * 3
    assert "".join(split_sentences(unbroken, 7)) == unbroken


def test_numbers_are_not_cut_when_avoidable() -> None:
    pieces = split_sentences("abc1234567", max_chars=8)
    assert pieces == ["abc", "1234567"]
    assert all(len(p) <= 4 for p in split_sentences("12345678901", max_chars=4))


def test_every_piece_respects_max_chars() -> None:
    text = ("The quick brown fox, jumping over 3.14159 lazy dogs; runs. " * 20) + "Supercalifragilistic" * 3
    for limit in (1, 5, 17, 60, 400):
        pieces = split_sentences(text, max_chars=limit)
        assert pieces and all(0 < len(p) <= limit for p in pieces)
        assert "".join("".join(pieces).split()) == "".join(text.split())
    with pytest.raises(ValueError):
        split_sentences("x", max_chars=0)


def test_plan_chunks_packs_sentences() -> None:
    text = "One. Two two. Three three three. Four."
    assert plan_chunks(text, max_chars=20) == ["One. Two two.", "Three three three.", "Four."]
    # a sentence longer than the limit is cut at spaces, and its tail packs with the next sentence
    assert plan_chunks(text, max_chars=14) == ["One. Two two.", "Three three", "three. Four."]
    assert plan_chunks("你好。今天天气很好！你去哪里？", 12) == ["你好。今天天气很好！", "你去哪里？"]
    assert plan_chunks(text, 1000) == [text]
