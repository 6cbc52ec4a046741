"""Text in pieces through the engine (``Engine.open``): exact, waits without frame steps, ends cleanly.

A feeder thread pushes random splits while the stream plays; the frames and the audio equal the
whole text's bitwise (same seed, same derived frame limit, same chunks), however often it waited.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.engines import counting_rounds
from tests.fixtures.polling import wait_until
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.engine.stream import SynthesisStream
from voxcast.errors import InvalidRequest

TEXT = "Dr. Smith arrived at 3 p.m. and said: don't worry, we'll be fine! Café déjà vu, 你好。"
BASE = {"voice": "ryan", "seed": 3, "non_streaming_text": False}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Callable[[str], Path]) -> Iterator[Engine]:
    eng = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), warmup=False, decode_thread="off")
    )
    eng.keep_codes = True
    yield eng
    eng.close()


def _feed(
    stream: SynthesisStream, text: str, seed: int, pause_s: float = 0.004, close: bool = True
) -> threading.Thread:
    def run() -> None:
        rng = random.Random(seed)
        data = text.encode() if seed % 2 else text  # odd seeds push bytes, split inside characters
        i = 0
        while i < len(data):
            n = rng.choice([1, 1, 2, 3, rng.randint(1, 9)])
            stream.push(data[i : i + n])
            i += n
            time.sleep(pause_s * rng.random())
        if close:
            stream.close_text()

    t = threading.Thread(target=run)
    t.start()
    return t


def _run(stream: SynthesisStream) -> np.ndarray:
    return np.concatenate([c.pcm for c in stream])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_frames_equal_the_whole_text(engine: Engine, seed: int) -> None:
    whole = engine.synthesize({**BASE, "text": TEXT})
    want = _run(whole)
    stream = engine.open(BASE)
    feeder = _feed(stream, TEXT, seed)
    got = _run(stream)
    feeder.join()
    t = stream.timing
    assert t.extra["codes"] == whole.timing.extra["codes"]
    assert t.frames == whole.timing.frames  # the whole text's derived limit (tiny models run to it)
    assert t.finish_reason == whole.timing.finish_reason == "max_frames"
    assert np.array_equal(got, want)  # the chunks are cut where the whole text's are: bitwise
    assert t.extra["text_in_pieces"]["tokens"] > 10


def test_text_complete_before_start_is_bitwise_the_whole_text(engine: Engine) -> None:
    whole = _run(engine.synthesize({**BASE, "text": TEXT}))
    stream = engine.open({**BASE, "text": TEXT[:20]})
    stream.push(TEXT[20:])
    stream.close_text()
    assert np.array_equal(_run(stream), whole)
    assert stream.timing.extra["text_in_pieces"]["waits"] == 0


def test_a_waiting_stream_costs_no_steps_and_does_not_hold_others(engine: Engine) -> None:
    waiting = engine.open({**BASE, "text": "Hello there, my "})  # "my" may still grow
    first = next(waiting)  # audio starts from the first complete words
    assert first.seq == 0
    wait_until(lambda: engine.stats()["waiting_text"] == 1, timeout_s=10)
    other = engine.synthesize({**BASE, "text": "Another stream runs meanwhile.", "max_frames": 12})
    assert sum(c.frames for c in other) == 12  # not held behind the waiting stream
    steps = engine.stats()["steps"]
    with counting_rounds(engine) as wait_round:
        wait_round()
    assert engine.stats()["steps"] == steps  # nothing stepped while the only stream waits
    waiting.push("friend.")
    waiting.close_text()
    rest = list(waiting)
    assert waiting.timing.finish_reason == "max_frames" and rest


def test_a_stream_left_waiting_ends_cleanly(tiny_model_dir: Callable[[str], Path]) -> None:
    cfg = EngineConfig(model=str(tiny_model_dir("custom_voice")), warmup=False, text_wait_s=0.3)
    engine = Engine.load(cfg)
    try:
        stream = engine.open({**BASE, "text": "Hello there, nobody closes", "max_frames": 30})
        chunks = list(stream)  # the text is taken as complete after 0.3 s, spoken to its end
        assert sum(c.frames for c in chunks) == 30 and stream.timing.extra["text_timeout"] is True
        eos = engine.open({**BASE, "text": "Hello there, nobody closes"})
        list(eos)
        assert eos.timing.extra["text_timeout"] is True
        idle = engine.open(BASE)  # no text at all: nothing to say
        with pytest.raises(InvalidRequest) as e:
            list(idle)
        assert e.value.field == "text"
    finally:
        engine.close()


@pytest.mark.parametrize("state", ["before_text", "waiting_prefill", "waiting_mid_stream", "playing"])
def test_cancel_in_every_state(engine: Engine, state: str) -> None:
    stream = engine.open({**BASE, "max_frames": 400})
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.extend(stream))
    reader.start()
    if state == "waiting_prefill":
        stream.push("Hello")  # not yet a complete word: the prefill waits
    elif state == "waiting_mid_stream":
        stream.push("Hello there, ")
        wait_until(lambda: bool(got), timeout_s=10)
    elif state == "playing":
        stream.push(TEXT)
        stream.close_text()
        wait_until(lambda: bool(got), timeout_s=10)
    wait_until(lambda: engine.stats()["waiting_text"] == (0 if state == "playing" else 1), timeout_s=10)
    stream.cancel()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert stream.timing.finish_reason == "cancelled"
    wait_until(lambda: engine.stats()["waiting_text"] == 0 and engine.stats()["active"] == 0, timeout_s=10)


def test_bad_use_is_refused_with_the_field(engine: Engine) -> None:
    closed = engine.open(BASE)
    closed.close_text()
    with pytest.raises(InvalidRequest) as e:
        closed.push("more")
    assert e.value.field == "text"
    with pytest.raises(InvalidRequest) as e:
        engine.synthesize({**BASE, "text": "Whole."}).push("more")
    assert e.value.field == "text"
    long = engine.open(BASE)
    with pytest.raises(InvalidRequest) as e:
        long.push("x" * 5001)
    assert e.value.field == "text"
    broken = engine.open(BASE)
    broken.push("caf\xc3".encode("latin-1"))  # ends inside a UTF-8 sequence
    with pytest.raises(InvalidRequest) as e:
        broken.close_text()
    assert e.value.field == "text"
    with pytest.raises(InvalidRequest) as e:
        engine.open({**BASE, "seed": -1})
    assert e.value.field == "seed"
    # the engine still serves
    assert sum(c.frames for c in engine.synthesize({**BASE, "text": "Still here.", "max_frames": 4})) == 4


def test_a_whole_text_layout_speaks_each_sentence_once_complete(engine: Engine) -> None:
    """``non_streaming_text``: the model needs whole text, so complete sentences become pieces of the
    stream as they arrive, each spoken as that sentence alone would be (same seed), in one stream."""
    whole_layout = {**BASE, "non_streaming_text": True}
    stream = engine.open({**whole_layout, "text": "Hello there. How are"})
    first = next(stream)  # the first sentence plays while the rest of the text is unwritten
    assert first.seq == 0
    wait_until(lambda: engine.stats()["waiting_text"] == 1, timeout_s=10)  # spoke it, waits for more
    stream.push(" you? Fine")
    stream.close_text()
    list(stream)
    t = stream.timing
    assert t.pieces == 3 and [p["chars"] for p in t.extra["pieces"]] == [12, 12, 4]
    want: list[Any] = []
    for sentence in ["Hello there.", "How are you?", "Fine"]:
        alone = engine.synthesize({**whole_layout, "text": sentence})
        list(alone)
        want += alone.timing.extra["codes"]
    assert t.extra["codes"] == want
    assert t.finish_reason == "max_frames" and t.extra["text_in_pieces"]["waits"] >= 1
