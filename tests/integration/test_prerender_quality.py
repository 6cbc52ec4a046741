"""Prerender's quality gate and per-preset loudness, through the real store backends and a real
(tiny, random) model: failing prompts are rendered again with the next seed and then reported; stored
files are plain audio files whose measured level is what the manifest says."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyloudnorm
import pytest
import soundfile as sf

from voxcast.audio.pcm import float_to_int16
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.engine.request import parse_request
from voxcast.engine.timing import Timing
from voxcast.prerender.library import PrerenderJob, prerender
from voxcast.service import Service, ServiceConfig
from voxcast.storage.base import BlobStore
from voxcast.testing.signals import speech_like


# -- a scripted service: the audio of each seed is chosen by the test --------------------------------
@dataclass
class ScriptedService:
    """Speech-shaped audio of a plausible length, except for the seeds in ``bad`` (a 2 s pause)."""

    store: BlobStore
    bad: set[int] = field(default_factory=set)
    seeds: list[int] = field(default_factory=list)
    engine: Any = field(default_factory=lambda: SimpleNamespace(identity="scripted@1"))
    watermarker: Any = None
    #: the ``watermark`` argument of every call (prerender asks for unmarked audio: it marks its own)
    watermark_args: list[bool] = field(default_factory=list)
    #: the ``realtime`` argument of every call (prerender has no listener: False, it yields to streams)
    realtime_args: list[bool | None] = field(default_factory=list)

    def synthesize(
        self,
        request: Any,
        store: bool = True,
        entry: str = "python",
        watermark: bool = True,
        realtime: bool | None = None,
    ) -> Any:
        self.watermark_args.append(watermark)
        self.realtime_args.append(realtime)
        req = parse_request(request)
        seed = req.sampling.seed
        self.seeds.append(seed)
        pcm = speech_like(1.5, seed=seed, pause_s=2.0 if seed in self.bad else 0.0)
        data = float_to_int16(pcm).tobytes()
        timing = Timing(request_id=req.request_id or "")
        timing.finish_reason, timing.total_ms = "eos", 1.0
        stream = SimpleNamespace(result=SimpleNamespace(timing=timing))
        stream.__iter__ = None
        return _Stream(
            [SimpleNamespace(data=data[i : i + 9600]) for i in range(0, len(data), 9600)], stream.result
        )


class _Stream:
    def __init__(self, chunks: list[Any], result: Any) -> None:
        self._chunks, self.result = chunks, result

    def __iter__(self) -> Iterator[Any]:
        return iter(self._chunks)


MANIFEST = "id,text,seed\ngood,Thank you for calling.,10\nonce,Please hold the line.,20\nnever,Goodbye and thank you for calling.,30\n"


def test_failing_prompts_are_rendered_again_then_reported(blob_store: BlobStore) -> None:
    service = ScriptedService(blob_store, bad={20, 30, 31, 32})
    spec = PrerenderJob.from_payload({"library": "acme", "manifest": MANIFEST, "presets": ["mulaw8k", "mp3"]})
    summary = prerender(service, spec)  # type: ignore[arg-type]
    assert service.seeds == [10, 20, 21, 30, 31, 32]
    assert (summary["rendered"], summary["failed"], summary["rerenders"], summary["gate_failed"]) == (
        2,
        1,
        3,
        1,
    )
    [error] = summary["errors"]
    assert error["id"] == "never" and error["field"] == "quality" and "pause" in error["message"]
    assert "after 3 attempt(s)" in error["message"]

    doc = json.loads(blob_store.get_bytes("libraries/acme/manifest.json"))
    once = doc["prompts"]["once"]
    assert once["quality"]["passed"] and once["quality"]["attempt"] == 2 and once["quality"]["seed"] == 21
    assert once["sampling"]["seed"] == 21 and set(once["quality"]["checks"]) >= {
        "pause",
        "duration",
        "loudness",
    }
    never = doc["prompts"]["never"]
    assert not never["quality"]["passed"] and never["objects"] == {}
    assert [t["seed"] for t in never["quality"]["tried"]] == [30, 31, 32]
    assert all(t["failed"] == ["pause"] for t in never["quality"]["tried"])
    keys = set(blob_store.list_keys("libraries/acme/"))
    assert not any("/never." in k for k in keys) and "libraries/acme/mulaw8k/once.wav" in keys

    service.bad = {30}  # the model (say, a new version) now renders seed 31 well: only "never" runs again
    service.seeds.clear()
    again = prerender(service, spec)  # type: ignore[arg-type]
    assert service.seeds == [30, 31] and (again["skipped"], again["rendered"], again["failed"]) == (2, 1, 0)


def test_with_the_gate_off_every_render_is_stored_as_it_came(local_store: BlobStore) -> None:
    service = ScriptedService(local_store, bad={20, 30})
    payload = {"library": "raw", "manifest": MANIFEST, "presets": ["pcm8k"], "gate": False}
    summary = prerender(service, PrerenderJob.from_payload(payload))  # type: ignore[arg-type]
    assert service.seeds == [10, 20, 30] and (summary["rendered"], summary["rerenders"]) == (3, 0)
    assert service.realtime_args == [False] * 3  # no listener: it yields to streams, never refused
    doc = json.loads(local_store.get_bytes("libraries/raw/manifest.json"))
    assert doc["prompts"]["never"]["quality"] == {
        **doc["prompts"]["never"]["quality"],
        "gate": False,
        "passed": False,
    }


# -- the tiny demo model, end to end ------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_service(demo_model_dir: Path) -> Iterator[Callable[[BlobStore], Service]]:
    engine = Engine.load(EngineConfig(model=str(demo_model_dir), device="cpu", warmup=False))
    yield lambda store: Service.assemble(ServiceConfig(), engine, store)
    engine.close()


def _is_g711_wav(data: bytes, tag: int) -> bool:
    """What `file` checks: RIFF....WAVE, then the fmt chunk's format tag."""
    return data[:4] == b"RIFF" and data[8:12] == b"WAVE" and data[12:16] == b"fmt " and data[20] == tag


def test_a_prerendered_library_holds_playable_files_at_the_measured_level(
    demo_service: Callable[[BlobStore], Service], blob_store: BlobStore
) -> None:
    manifest = "id,text,voice,seed\nwelcome,Welcome to Acme.,ryan,8\nhold,Please hold.,ryan,3\n"
    # a random model cannot read: its lengths are not tied to the text, so the pace window is wide
    gate = {"chars_per_s": [0.5, 100], "max_attempts": 4}
    payload = {
        "library": "demo",
        "manifest": manifest,
        "presets": ["mulaw8k", "alaw8k", "pcm16k", "mp3"],
        "gate": gate,
    }
    summary = prerender(demo_service(blob_store), PrerenderJob.from_payload(payload))
    assert summary["failed"] == 0 and summary["rendered"] == 2, summary["errors"]
    doc = json.loads(blob_store.get_bytes("libraries/demo/manifest.json"))
    for entry in doc["prompts"].values():
        assert entry["quality"]["passed"] and entry["quality"]["checks"]["finished"]["value"] == "eos"
        for name, obj in entry["objects"].items():
            data = blob_store.get_bytes(obj["key"])
            if name == "mulaw8k":
                assert _is_g711_wav(data, 7)
            elif name == "alaw8k":
                assert _is_g711_wav(data, 6)
            elif name == "mp3":
                assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0)
            x, sr = sf.read(io.BytesIO(data), dtype="float64")
            assert sr == obj["sample_rate"]
            measured = pyloudnorm.Meter(sr).integrated_loudness(x)
            assert measured == pytest.approx(obj["loudness_lufs"], abs=0.05)
            assert abs(measured - (-19.0)) <= 1.0 and obj["true_peak_dbtp"] <= -0.9


def test_the_gate_catches_runaways_of_the_test_model(
    tiny_model_dir: Callable[[str], Path], local_store: BlobStore
) -> None:
    """The ordinary test checkpoint never ends its speech: every attempt runs to the frame limit."""
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False))
    try:
        service = Service.assemble(ServiceConfig(), engine, local_store)
        manifest = "id,text,voice,seed,max_frames\nlong,Hello.,ryan,1,8\n"
        payload = {"library": "t", "manifest": manifest, "presets": ["pcm8k"], "gate": {"max_attempts": 2}}
        summary = prerender(service, PrerenderJob.from_payload(payload))
    finally:
        engine.close()
    assert (summary["failed"], summary["rerenders"]) == (1, 1)
    assert "finished: max_frames" in summary["errors"][0]["message"]
    assert list(local_store.list_keys("libraries/t/")) == ["libraries/t/manifest.json"]
