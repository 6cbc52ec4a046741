"""Prerender figures: the loudness of every preset's files, and the quality gate's re-renders.

A library of 8 prompts is rendered from a speech-shaped source (voxcast.testing.signals: the spectrum
and syllable rhythm of speech, so 8 kHz files keep what real speech keeps) through the real prerender
path (post-processing, per-preset levelling, gate, store). Some seeds are made to render badly (a 2.5 s
pause in the middle): the gate must re-render those prompts with the next seed, and report the one
whose every attempt is bad. Each stored file is read back and measured with pyloudnorm, next to what
normalising once at 24 kHz before resampling (what versions before manifest schema 2 did) gives.

    python scripts/bench_prerender.py            # prints a table; writes bench-results/prerender.json
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyloudnorm
import soundfile as sf

from voxcast.audio.encode import encode_file
from voxcast.audio.loudness import normalize_loudness, true_peak_dbfs
from voxcast.audio.pcm import float_to_int16
from voxcast.engine.request import parse_request
from voxcast.engine.timing import Timing
from voxcast.prerender.library import PrerenderJob, prerender
from voxcast.prerender.presets import DEFAULT_PRESETS, PRESETS, PostProcess, postprocess
from voxcast.storage.local import LocalBlobStore
from voxcast.testing.signals import speech_like

PROMPTS = [
    ("welcome", "Thank you for calling Acme Corporation.", 101),
    ("menu", "For sales, press one. For support, press two.", 202),
    ("hold", "Please hold while we connect your call.", 303),
    ("closed", "Our offices are closed. Please call again tomorrow.", 404),
    ("invalid", "Sorry, that is not a valid option.", 505),
    ("transfer", "Transferring you now.", 606),
    ("voicemail", "Please leave a message after the tone.", 707),
    ("goodbye", "Thank you. Goodbye.", 808),
]
#: Seeds whose render has a long pause: menu once, closed twice, goodbye on every attempt.
BAD_SEEDS = {202, 404, 405, 808, 809, 810}


class SpeechSource:
    """A service whose audio is speech-shaped, as long as the text would take at 14 letters a second."""

    def __init__(self, store: LocalBlobStore) -> None:
        self.store = store
        self.engine = SimpleNamespace(identity="speech-shaped@1")
        self.renders = 0

    def synthesize(self, request: Any, store: bool = True) -> Any:
        req = parse_request(request)
        self.renders += 1
        seed = int(req.sampling.seed or 0)
        seconds = sum(ch.isalnum() for ch in req.text) / 14.0
        pcm = speech_like(seconds, seed=seed, level=0.08, pause_s=2.5 if seed in BAD_SEEDS else 0.0)
        data = float_to_int16(pcm).tobytes()
        timing = Timing(request_id=req.request_id or "")
        timing.finish_reason, timing.total_ms = "eos", 0.0
        return _Stream([SimpleNamespace(data=data)], SimpleNamespace(timing=timing))


class _Stream:
    def __init__(self, chunks: list[Any], result: Any) -> None:
        self.chunks, self.result = chunks, result

    def __iter__(self) -> Any:
        return iter(self.chunks)


def _measure(data: bytes) -> tuple[float, float]:
    x, sr = sf.read(io.BytesIO(data), dtype="float64")
    return float(pyloudnorm.Meter(sr).integrated_loudness(x)), true_peak_dbfs(x.astype(np.float32), sr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench-results/prerender.json"))
    args = ap.parse_args()
    post = PostProcess()
    manifest = json.dumps({"prompts": [{"id": i, "text": t, "seed": s} for i, t, s in PROMPTS]})
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalBlobStore(Path(tmp), fsync=False)
        source = SpeechSource(store)
        spec = PrerenderJob.from_payload(
            {"library": "acme", "manifest": manifest, "presets": list(DEFAULT_PRESETS)}
        )
        summary = prerender(source, spec)  # type: ignore[arg-type]
        doc = json.loads(store.get_bytes("libraries/acme/manifest.json"))
        levels: dict[str, dict[str, list[float]]] = {
            p: {"new": [], "old": [], "peak": []} for p in DEFAULT_PRESETS
        }
        for pid, entry in doc["prompts"].items():
            if not entry["objects"]:
                continue
            seed = entry["quality"]["seed"]
            text = next(t for i, t, _ in PROMPTS if i == pid)
            raw = speech_like(sum(c.isalnum() for c in text) / 14.0, seed=seed, level=0.08)
            trimmed, _ = postprocess(raw, post)
            once = normalize_loudness(trimmed, 24000, -19.0, -1.0).pcm
            for name, obj in entry["objects"].items():
                lufs, peak = _measure(store.get_bytes(obj["key"]))
                assert abs(lufs - obj["loudness_lufs"]) < 0.05, (pid, name, lufs, obj["loudness_lufs"])
                levels[name]["new"].append(lufs)
                levels[name]["peak"].append(peak)
                preset = PRESETS[name]
                levels[name]["old"].append(_measure(encode_file(once, preset.format, preset.sample_rate))[0])
    table = {
        name: {
            "lufs_min": round(min(v["new"]), 2),
            "lufs_max": round(max(v["new"]), 2),
            "true_peak_max_dbtp": round(max(v["peak"]), 2),
            "before_lufs_min": round(min(v["old"]), 2),
            "before_lufs_max": round(max(v["old"]), 2),
        }
        for name, v in levels.items()
    }
    gate = {k: summary[k] for k in ("rendered", "failed", "rerenders", "gate_failed")}
    gate["renders"] = source.renders
    gate["attempts"] = {pid: e["quality"]["attempt"] for pid, e in doc["prompts"].items()}
    gate["errors"] = summary["errors"]
    print(f"{'preset':<9} {'LUFS (target -19)':>18} {'true peak':>10} {'before: 24 kHz once':>21}")
    for name, r in table.items():
        print(
            f"{name:<9} {r['lufs_min']:>8.2f}..{r['lufs_max']:<8.2f} {r['true_peak_max_dbtp']:>9.2f} "
            f"{r['before_lufs_min']:>10.2f}..{r['before_lufs_max']:<8.2f}"
        )
    print(
        f"gate: {gate['renders']} renders for {len(PROMPTS)} prompts ({gate['rerenders']} re-renders), "
        f"{gate['rendered']} stored, {gate['gate_failed']} failed: "
        + "; ".join(f"{e['id']}: {e['message']}" for e in gate["errors"])
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {"cpu": platform.processor() or platform.machine(), "levels": table, "gate": gate}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
