"""Engine benchmark: voxcast vs the official qwen-tts on the same full-size random checkpoint.

Builds (once, cached) a random-weight 0.6B Base checkpoint from the real config, clones a voice from
a synthetic 3 s reference (ICL, streaming text), and measures in the same run, interleaved:
  voxcast: time to first audio, prefill, per-frame decode (talker + code predictor), codec per frame,
           real-time factor, and TTFA against its floor (prefill + one frame + one-frame codec decode);
  official: generate_voice_clone wall time, its code generation alone (per frame), on the same
           weights, text and frame count.
Prints a table and writes bench-results/engine.json.

    python scripts/bench_engine.py [--size 0.6b] [--frames 30] [--runs 2] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from benchlib import ROOT, checkpoint, machine_info, use_checkout

use_checkout()

from voxcast.audio.reference import synthetic_reference_audio  # noqa: E402
from voxcast.config import EngineConfig  # noqa: E402
from voxcast.engine.engine import Engine  # noqa: E402

TEXT = "Thank you for calling. Your order has shipped and will arrive on Tuesday afternoon."
REF_TEXT = "This is a reference recording for the benchmark."


def run_voxcast(
    engine: Engine, voice: Any, frames: int, seed: int, one_frame_codec: float
) -> dict[str, float]:
    stream = engine.synthesize(
        {"text": TEXT, "max_frames": frames, "seed": seed, "request_id": "bench"}, voice
    )
    n = sum(c.frames for c in stream)
    t = stream.timing
    return {
        "frames": n,
        "ttfa_ms": t.ttfa_ms,
        "prefill_ms": t.prefill_ms,
        "frame_ms": t.frame_ms,
        "talker_ms_per_frame": t.talker_ms / n,
        "code_predictor_ms_per_frame": t.code_predictor_ms / n,
        "codec_ms_per_frame": t.codec_ms / n,
        "total_ms": t.total_ms,
        "rtf": t.rtf,
        "ttfa_floor_ms": t.prefill_ms + t.frame_ms + one_frame_codec,
    }


def run_official(wrapper: Any, items: list[Any], frames: int, seed: int) -> dict[str, float]:
    model = wrapper.model
    timings: dict[str, float] = {}
    orig = model.generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = orig(*a, **k)
        timings["generate_ms"] = (time.perf_counter() - t0) * 1000
        timings["frames"] = int(out[0][0].shape[0])
        return out

    model.generate = timed_generate
    try:
        with torch.inference_mode():
            torch.manual_seed(seed)
            t0 = time.perf_counter()
            wrapper.generate_voice_clone(
                TEXT, language="English", voice_clone_prompt=items, max_new_tokens=frames + 1
            )
            timings["total_ms"] = (time.perf_counter() - t0) * 1000
    finally:
        del model.generate
    timings["frame_ms"] = timings["generate_ms"] / max(1, timings["frames"])
    timings["ttfa_ms"] = timings["total_ms"]  # no streaming: first audio is the whole clip
    return timings


def one_frame_codec_ms(engine: Engine, voice: Any, reps: int = 5) -> float:
    codes = torch.zeros(1, 16, dtype=torch.long)
    out = []
    with torch.inference_mode():
        for _ in range(reps):
            dec = engine.model.new_decoder(voice)
            t0 = time.perf_counter()
            dec.decode(codes)
            out.append((time.perf_counter() - t0) * 1000)
    return statistics.median(out)


def median(rows: list[dict[str, float]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--no-official", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "engine.json")
    args = ap.parse_args()

    path = checkpoint(args.size)
    engine = Engine.load(EngineConfig(model=str(path), device="cpu", dtype=args.dtype))
    ref = synthetic_reference_audio(24000, seconds=3.0)
    t0 = time.perf_counter()
    voice = engine.model.make_voice_prompt(ref, 24000, ref_text=REF_TEXT)
    voice_ms = (time.perf_counter() - t0) * 1000
    codec1 = one_frame_codec_ms(engine, voice)

    wrapper, items = None, None
    if not args.no_official:
        from tests.parity._official import load_official, official_voice_items

        dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
        wrapper = load_official(path, dtype=dtype)
        items = official_voice_items(wrapper, ref, 24000, REF_TEXT, False)

    ours, theirs = [], []
    for i in range(args.runs):  # interleaved
        ours.append(run_voxcast(engine, voice, args.frames, seed=i, one_frame_codec=codec1))
        print(f"voxcast  run {i}: {json.dumps({k: round(v, 1) for k, v in ours[-1].items()})}", flush=True)
        if wrapper is not None and items is not None:
            theirs.append(run_official(wrapper, items, args.frames, seed=i))
            print(
                f"official run {i}: {json.dumps({k: round(v, 1) for k, v in theirs[-1].items()})}", flush=True
            )
    engine.close()

    summary: dict[str, Any] = {
        "machine": machine_info(),
        "config": vars(args) | {"out": str(args.out), "checkpoint": str(path)},
        "load_ms": engine.load_ms,
        "warmup_ms": engine.warmup_ms,
        "voice_prompt_ms": voice_ms,
        "voxcast": {k: median(ours, k) for k in ours[0]},
        "voxcast_runs": ours,
    }
    v = summary["voxcast"]
    summary["ttfa_over_floor"] = v["ttfa_ms"] / v["ttfa_floor_ms"]
    if theirs:
        summary["official"] = {k: median(theirs, k) for k in theirs[0]}
        summary["official_runs"] = theirs
        o = summary["official"]
        summary["ratios"] = {
            "frame_ms_voxcast_over_official": v["frame_ms"] / o["frame_ms"],
            "ttfa_voxcast_over_official": v["ttfa_ms"] / o["ttfa_ms"],
            "total_voxcast_over_official": v["total_ms"] / o["total_ms"],
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print("\n== summary (medians) ==")
    print(f"load {engine.load_ms:.0f} ms, warm-up {engine.warmup_ms:.0f} ms, voice prompt {voice_ms:.0f} ms")
    print(
        f"voxcast : TTFA {v['ttfa_ms']:.0f} ms (floor {v['ttfa_floor_ms']:.0f} ms, x{summary['ttfa_over_floor']:.2f}), "
        f"frame {v['frame_ms']:.0f} ms (talker {v['talker_ms_per_frame']:.0f} + code predictor "
        f"{v['code_predictor_ms_per_frame']:.0f}), codec {v['codec_ms_per_frame']:.0f} ms/frame, RTF {v['rtf']:.2f}"
    )
    if theirs:
        o, r = summary["official"], summary["ratios"]
        print(f"official: first audio {o['ttfa_ms']:.0f} ms (= total), frame {o['frame_ms']:.0f} ms")
        print(
            f"ratios  : frame x{r['frame_ms_voxcast_over_official']:.2f}, TTFA x{r['ttfa_voxcast_over_official']:.3f}, "
            f"total x{r['total_voxcast_over_official']:.2f} (voxcast / official)"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
