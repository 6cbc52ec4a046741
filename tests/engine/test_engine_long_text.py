"""Long texts: planned into sentence pieces and spoken in order in one stream, each piece with its own
frame limit, the next piece prefilled while the current one plays, one seed for all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from voxcast import Engine, EngineConfig
from voxcast.config import max_frames_for_text
from voxcast.engine.request import MAX_TEXT_CHARS, parse_request
from voxcast.text import plan_chunks

SENTENCES = (
    "Dr. Smith arrived at 3 p.m. on a rainy Monday.",
    "The U.S.A. team scored 3.5 points more than expected!",
    "Was the meeting moved to the fourth floor, or was it cancelled?",
    "Please call extension No. 5 before noon; the line closes early.",
    "你好。今天的天气很好。",
)


def long_text(chars: int) -> str:
    out, i = [], 0
    while sum(len(s) + 1 for s in out) < chars:
        out.append(SENTENCES[i % len(SENTENCES)])
        i += 1
    return " ".join(out)[:chars].rsplit(" ", 1)[0] + "."


@pytest.fixture(scope="module")
def demo_engine(demo_model_dir: Path) -> Any:
    """A tiny CustomVoice checkpoint whose speech ends by end-of-speech (the demo model)."""
    engine = Engine.load(EngineConfig(model=str(demo_model_dir), device="cpu", warmup=False, max_active=2))
    yield engine
    engine.close()


def _run(engine: Engine, **fields: Any) -> tuple[np.ndarray, Any]:
    stream = engine.synthesize(parse_request({"voice": "ryan", "seed": 8, **fields}))
    pcm = np.concatenate([c.pcm for c in stream])
    return pcm, stream.timing


def test_a_5000_character_text_is_spoken_to_its_end(demo_engine: Engine) -> None:
    text = long_text(MAX_TEXT_CHARS)
    assert 4900 <= len(text) <= MAX_TEXT_CHARS
    planned = plan_chunks(parse_request({"text": text}).text, demo_engine.config.piece_chars)
    pcm, t = _run(demo_engine, text=text)
    assert t.pieces == len(planned) >= 12
    pieces = t.extra["pieces"]
    assert [p["chars"] for p in pieces] == [len(p) for p in planned]
    assert all(p["finish_reason"] == "eos" for p in pieces), pieces
    assert t.finish_reason == "eos" and not t.runaway
    assert sum(p["frames"] for p in pieces) == t.frames
    # more frames than one piece's limit could give: nothing capped the whole text
    assert t.frames > max_frames_for_text(planned[0])
    assert len(pcm) == t.frames * demo_engine.model.samples_per_frame
    # the pieces after the first were prefilled between the frames of the one before
    assert any(p["ahead"] for p in pieces[1:])


def test_one_seed_for_all_pieces_gives_the_same_audio_again(demo_engine: Engine) -> None:
    text = long_text(1200)
    first, t1 = _run(demo_engine, text=text)
    second, t2 = _run(demo_engine, text=text)
    assert t1.pieces == t2.pieces >= 3
    assert np.array_equal(first, second)


def test_each_piece_has_its_own_runaway_guard(tiny_model_dir: Any) -> None:
    """Test checkpoints run every piece to its limit: each piece stops at its own derived limit."""
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, piece_chars=60)
    )
    try:
        text = " ".join(SENTENCES[:3])  # four pieces (six of 4 sentences ran 710 frames, these 497)
        planned = plan_chunks(text, 60)
        _, t = _run(engine, text=text)
        assert t.pieces == len(planned) >= 3
        assert [p["frames"] for p in t.extra["pieces"]] == [max_frames_for_text(p) for p in planned]
        assert t.runaway and t.finish_reason == "max_frames"

        # a caller's max_frames caps the whole text (not a runaway: it is what they asked for)
        cap = max_frames_for_text(planned[0]) + 10
        _, capped = _run(engine, text=text, max_frames=cap)
        assert capped.frames == cap and not capped.runaway
        assert capped.pieces == len(planned) and [p["frames"] for p in capped.extra["pieces"]] == [
            cap - 10,
            10,
        ]
    finally:
        engine.close()


def test_a_long_text_can_be_cancelled_in_a_later_piece(demo_engine: Engine) -> None:
    stream = demo_engine.synthesize(parse_request({"text": long_text(2000), "voice": "ryan", "seed": 8}))
    frames = 0
    for chunk in stream:
        frames += chunk.frames
        if frames > 150:
            stream.cancel()
    assert stream.timing.finish_reason == "cancelled"
    assert 1 < len(stream.timing.extra["pieces"]) < stream.timing.pieces


def test_short_texts_are_one_piece_and_the_setting_is_checked(demo_engine: Engine) -> None:
    _, t = _run(demo_engine, text="Hello there. A short one.")
    assert t.pieces == 1 and "pieces" not in t.extra
    assert EngineConfig.from_env({"VOXCAST_PIECE_CHARS": "0"}).piece_chars == 0
    with pytest.raises(ValueError, match="VOXCAST_PIECE_CHARS"):
        EngineConfig(piece_chars=5)


def test_with_planning_off_a_long_text_is_cut_at_the_frame_cap(tmp_path: Path, tiny_model_dir: Any) -> None:
    engine = Engine.load(
        EngineConfig(
            model=str(tiny_model_dir("custom_voice")),
            device="cpu",
            warmup=False,
            piece_chars=0,
            max_frames_cap=60,
        )
    )
    try:
        _, t = _run(engine, text=long_text(600))
        assert t.pieces == 1 and t.frames == 60 and t.runaway
    finally:
        engine.close()
