"""Interleaved prefill: a new request's prefill runs in parts between the active streams' frames.

A lone request gets the one-pass prefill (bitwise the official path); a request admitted while
others decode is prefilled ``prefill_chunk`` positions per scheduler round. A prefill in parts equals
the one-pass prefill up to float rounding: on the tiny checkpoint greedy codes are identical.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.polling import wait_until
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.model import Qwen3TTS

Factory = Callable[[str], Path]
TEXT = "A request admitted while another one speaks is prefilled a few positions at a time."


def _codes(gen: object) -> list[list[int]]:
    out = []
    while (f := gen.step()) is not None:  # type: ignore[attr-defined]
        out.append(f.tolist())
    return out


@pytest.fixture(scope="module")
def model(tiny_model_dir: Factory) -> Qwen3TTS:
    return Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")))


@pytest.mark.parametrize("part", [1, 5, 16])
def test_prefill_in_parts_matches_one_pass(model: Qwen3TTS, part: int) -> None:
    prompt = model.build_prompt(TEXT, speaker="ryan")
    whole = model.new_generator(prompt, SamplingParams(greedy=True), 10)
    whole.prefill()
    parts = model.new_generator(prompt, SamplingParams(greedy=True), 10)
    n = 0
    while not parts.prefill_part(part):
        n += 1
        assert not parts.prefilled
    assert parts.prefilled and n + 1 == -(-prompt.length // part)
    torch.testing.assert_close(parts._hidden, whole._hidden, rtol=0, atol=1e-5)
    assert _codes(parts) == _codes(whole)


def test_one_part_is_the_one_pass_prefill(model: Qwen3TTS) -> None:
    prompt = model.build_prompt(TEXT, speaker="vivian")
    a = model.new_generator(prompt, SamplingParams(greedy=True), 6)
    a.prefill()
    b = model.new_generator(prompt, SamplingParams(greedy=True), 6)
    assert b.prefill_part(None)
    assert torch.equal(a._hidden, b._hidden)
    with pytest.raises(RuntimeError):
        b.prefill()


def test_prefill_in_parts_fills_and_uses_the_prefix_cache(model: Qwen3TTS) -> None:
    model.prefix_cache_enabled = True
    model.prefix_kv.clear()
    prompt = model.build_prompt(TEXT, speaker="ryan", language="english")
    assert prompt.prefix_len > 2
    first = model.new_generator(prompt, SamplingParams(greedy=True), 8)
    while not first.prefill_part(2):  # the prefix is stored once the parts pass it
        pass
    assert not first.prefix_hit
    second = model.new_generator(prompt, SamplingParams(greedy=True), 8)
    assert second.prefill_part(3) is (prompt.length - prompt.prefix_len <= 3)
    assert second.prefix_hit and second.prefix_positions == prompt.prefix_len
    while not second.prefill_part(3):
        pass
    model.prefix_cache_enabled = False
    assert _codes(second) == _codes(first)


def test_engine_interleaves_a_new_prefill_with_active_streams(tiny_model_dir: Factory) -> None:
    cfg = EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, prefill_chunk=4)
    engine = Engine.load(cfg)
    try:
        request = {"text": TEXT, "voice": "ryan", "greedy": True, "max_frames": 12}
        alone = engine.synthesize(request)
        pcm_alone = np.concatenate([c.pcm for c in alone])
        assert alone.timing.prefill_parts == 1

        long = engine.synthesize({**request, "text": TEXT * 3, "max_frames": 40})
        it = iter(long)
        next(it)  # the long request is decoding now
        late = engine.synthesize(request)
        pcm_late = np.concatenate([c.pcm for c in late])
        rest = list(it)
        assert rest and long.timing.finish_reason == "max_frames"
        assert late.timing.prefill_parts > 1  # prefilled between the long stream's frames
        assert late.timing.prefill_ms > 0 and late.timing.frames == 12
        np.testing.assert_allclose(pcm_late, pcm_alone, rtol=0, atol=1e-4)
    finally:
        engine.close()


@pytest.mark.parametrize("chunk", [0, 2])
def test_a_text_in_pieces_opened_while_another_plays_is_prefilled_in_prefill_chunk_parts(
    tiny_model_dir: Factory, chunk: int
) -> None:
    """``prefill_chunk`` positions per round between the playing stream's frames; 0: whole at once."""
    cfg = EngineConfig(
        model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, prefill_chunk=chunk
    )
    engine = Engine.load(cfg)
    try:
        long = engine.synthesize({"text": TEXT * 3, "voice": "ryan", "greedy": True, "max_frames": 40})
        it = iter(long)
        next(it)  # the long request is playing now
        late = engine.open(
            {"text": TEXT, "voice": "vivian", "greedy": True, "max_frames": 6}
        )  # no prefix hit
        late.close_text()
        assert len(list(late)) > 0 and late.timing.frames == 6
        assert list(it) and long.timing.frames == 40  # it played on meanwhile
        if chunk:
            assert late.timing.prefill_parts > 1
        else:
            assert late.timing.prefill_parts == 1
    finally:
        engine.close()


@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "pieces"])
def test_a_stream_that_fails_once_prefilled_fails_alone(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch, pieces: bool
) -> None:
    cfg = EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False)
    engine = Engine.load(cfg)
    try:
        real = engine._scheduler._pieces.prefilled

        def failing(act: object) -> None:
            if act.stream.request.voice == "vivian":  # type: ignore[attr-defined]
                raise RuntimeError("broken after its prefill")
            real(act)  # type: ignore[arg-type]

        monkeypatch.setattr(engine._scheduler._pieces, "prefilled", failing)
        request = {"text": TEXT, "voice": "vivian", "greedy": True, "max_frames": 4}
        if pieces:
            bad = engine.open(request)
            bad.close_text()
        else:
            bad = engine.synthesize(request)
        with pytest.raises(RuntimeError, match="broken after its prefill"):
            list(bad)
        assert engine.alive
        good = engine.synthesize({**request, "voice": "ryan"})
        assert len(list(good)) > 0 and good.timing.frames == 4
    finally:
        engine.close()


def test_engine_reports_prefix_cache_hits(tiny_model_dir: Factory) -> None:
    cfg = EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False)
    engine = Engine.load(cfg)
    try:
        request = {"text": TEXT, "voice": "vivian", "language": "english", "greedy": True, "max_frames": 3}
        first, second = engine.synthesize(request), None
        list(first)
        second = engine.synthesize(request)
        list(second)
        assert first.timing.prefix_cache_hit is False and first.timing.prefix_positions == 0
        assert second.timing.prefix_cache_hit is True and second.timing.prefix_positions > 0
        assert second.timing.to_dict()["prefix_cache_hit"] is True
    finally:
        engine.close()


@pytest.mark.parametrize("burst", [True, False])
@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "pieces"])
def test_requests_arriving_together_start_together(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch, burst: bool, pieces: bool
) -> None:
    """Whole texts (HTTP, RunPod, RQ) and texts in pieces (the WebSocket) alike."""
    cfg = EngineConfig(
        model=str(tiny_model_dir("custom_voice")),
        device="cpu",
        warmup=False,
        prefill_chunk=4,
        burst_admit=burst,
    )
    engine = Engine.load(cfg)
    try:
        name = "open_prompt" if pieces else "build_prompt"  # what admitting a request builds
        real = getattr(engine.model, name)
        calls = []

        def slow_first(*a: object, **kw: object) -> object:
            calls.append(1)
            if len(calls) == 1:  # the others queue up meanwhile: a burst
                wait_until(lambda: engine.stats()["waiting"] == 2, what="the other two requests queued")
            return real(*a, **kw)

        monkeypatch.setattr(engine.model, name, slow_first)
        request = {"text": TEXT, "voice": "ryan", "greedy": True, "max_frames": 8}
        if pieces:
            streams = [engine.open({**request, "seed": i}) for i in range(3)]
            for stream in streams:
                stream.close_text()
        else:
            streams = [engine.synthesize({**request, "seed": i}) for i in range(3)]
        chunks: list[list[float]] = [[] for _ in streams]

        def play(i: int) -> None:
            chunks[i] = [c.t_emit for c in streams[i]]

        threads = [threading.Thread(target=play, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        firsts, seconds = [c[0] for c in chunks], [c[1] for c in chunks]
        parts = [s.timing.prefill_parts for s in streams]
        if burst:  # all three prefilled whole before anyone's first frame: first chunks before any second
            assert parts == [1, 1, 1] and max(firsts) < min(seconds)
        else:  # one per round: the later ones wait (whole texts: prefilled in parts) while the first plays
            assert max(firsts) > min(seconds)
            # a text in pieces leaves a prefill of one part after the prefix cache
            assert max(parts) == 1 if pieces else max(parts) > 1
        assert all(s.timing.frames == 8 for s in streams)
    finally:
        engine.close()


def test_burst_admit_setting() -> None:
    assert EngineConfig().burst_admit is True
    assert EngineConfig.from_env({"VOXCAST_BURST_ADMIT": "0"}).burst_admit is False
    assert EngineConfig.from_env({"VOXCAST_BURST_ADMIT": "on"}).burst_admit is True
