"""normalize_text: conservative, idempotent, cache-key friendly."""

from __future__ import annotations

import pytest

from voxcast.text.normalize import normalize_text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Hello,\t\tworld!\n\n", "Hello, world!"),
        ("Cafe\u0301", "Café"),  # NFC
        ("a\u00a0b\u2009c\u3000d", "a b c d"),  # NBSP, thin space, ideographic space
        ("line\u2028sep\u2029para", "line sep para"),
        ("zero\u200bwidth\u00adsoft\ufeffbom\u200emark", "zerowidthsoftbommark"),
        ("bell\x07 and \x1b[0m escape", "bell and [0m escape"),
        ("\u201cquoted\u201d and \u2018single\u2019 \u201elow\u201c", '"quoted" and \'single\' "low"'),
        ("it\u2019s", "it's"),
        ("well\u2010known \u22125 \u2011x", "well-known -5 -x"),
        ("wait\u2015what", "wait\u2014what"),
        ("en\u2013dash em\u2014dash \u00abguillemets\u00bb \u300c\u62ec\u300d \u2026", None),
        ("I have 3.5 apples, $12 and 1/2", "I have 3.5 apples, $12 and 1/2"),  # numbers untouched
        (
            "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
            "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        ),  # ZWNJ kept
        ("\U0001f468\u200d\U0001f469", "\U0001f468\u200d\U0001f469"),  # ZWJ kept
        ("   \n\t ", ""),
    ],
)
def test_normalize_cases(raw: str, expected: str | None) -> None:
    assert normalize_text(raw) == (raw if expected is None else expected)


def test_idempotent_and_equivalent_inputs_share_a_key() -> None:
    samples = ["  \u201cHi\u201d\u00a0there\u2026 ", "Cafe\u0301 \u2212 3", "a\r\nb"]
    for s in samples:
        assert normalize_text(normalize_text(s)) == normalize_text(s)
    assert normalize_text("Press  one.\n") == normalize_text("Press one.")
