"""Prefix KV cache benchmark: prefill time of a cache miss vs a hit for an ICL voice clone.

Loads a Base checkpoint (default: the random full-size 0.6B one that scripts/bench_decode.py builds
in .cache/bench-models/0.6b-base; ``--tiny`` uses the tiny test checkpoint), makes an ICL voice from
random reference codes (36 frames, ~3 s) and a reference text, and prefills a one-sentence text in
streaming-text mode (the clone default). Runs are interleaved (hit, miss, hit, miss, ...; the store
is cleared before each miss) after one warm-up of each; prints medians and the hit/miss ratio, and
writes bench-results/prefix.json. Also reports how far the hit's last hidden state is from the miss's.

    python scripts/bench_prefix.py [--model DIR | --tiny] [--reps 3] [--ref-frames 36]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
from benchlib import use_checkout  # noqa: E402

use_checkout()


from voxcast.engine.request import SamplingParams  # noqa: E402
from voxcast.models.qwen3_tts.generator import FrameGenerator  # noqa: E402
from voxcast.models.qwen3_tts.model import Qwen3TTS  # noqa: E402
from voxcast.models.qwen3_tts.prompt import Prompt  # noqa: E402
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt  # noqa: E402

TEXT = "Thank you for calling. Your order has shipped and will arrive on Tuesday afternoon."
REF_TEXT = "This is a reference recording for the benchmark."


def icl_voice(model: Qwen3TTS, frames: int) -> VoicePrompt:
    """An ICL voice with random reference codes and x-vector (no audio encoders involved)."""
    g = torch.Generator().manual_seed(0)
    x_vector = torch.randn(model.config.talker.hidden_size, generator=g)
    codes = torch.randint(0, 2048, (frames, 16), generator=g)
    return VoicePrompt(x_vector, codes, REF_TEXT, None, False, model.identity)


def prefill(model: Qwen3TTS, prompt: Prompt) -> FrameGenerator:
    gen = model.new_generator(prompt, SamplingParams(seed=0, greedy=True), 1)
    gen.prefill()
    return gen


def timed(model: Qwen3TTS, voice: VoicePrompt, *, miss: bool) -> tuple[dict[str, float], FrameGenerator]:
    """One request: prompt build then prefill; ``miss`` clears the store first."""
    if miss:
        model.prefix_kv.clear()
    t0 = time.perf_counter()
    prompt = model.build_prompt(TEXT, voice=voice, language="english")
    prompt_ms = (time.perf_counter() - t0) * 1000
    gen = prefill(model, prompt)
    assert gen.prefix_hit != miss
    return {"prompt_ms": prompt_ms, "prefill_ms": gen.prefill_s * 1000}, gen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / ".cache" / "bench-models" / "0.6b-base")
    ap.add_argument("--tiny", action="store_true", help="use the tiny Base test checkpoint")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ref-frames", type=int, default=36)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "prefix.json")
    args = ap.parse_args()

    if args.tiny:
        from tests.fixtures.models import build_cached_model

        args.model = build_cached_model("base")
    elif not (args.model / "config.json").is_file():
        print(f"no checkpoint in {args.model}: run scripts/bench_decode.py first (it builds it)")
        return 2
    model = Qwen3TTS.from_pretrained(str(args.model), prefix_cache=True)
    voice = icl_voice(model, args.ref_frames)
    prompt = model.build_prompt(TEXT, voice=voice, language="english")
    with torch.inference_mode():
        timed(model, voice, miss=True)  # warm-up: one miss, one hit
        timed(model, voice, miss=False)
        hits, misses = [], []
        for i in range(args.reps):
            row, hit_gen = timed(model, voice, miss=False)
            hits.append(row)
            row, miss_gen = timed(model, voice, miss=True)
            misses.append(row)
            print(
                f"rep {i}: hit {hits[-1]['prefill_ms']:.1f} ms, miss {misses[-1]['prefill_ms']:.1f} ms",
                flush=True,
            )
        diff = float((hit_gen._hidden - miss_gen._hidden).abs().max())  # type: ignore[operator]
        same_code0 = bool(torch.equal(hit_gen._code0, miss_gen._code0))  # type: ignore[arg-type]

    def med(rows: list[dict[str, float]], key: str) -> float:
        return float(statistics.median(r[key] for r in rows))

    summary: dict[str, Any] = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
        },
        "checkpoint": str(args.model),
        "mode": "clone_icl, streaming text, float32",
        "reps": args.reps,
        "ref_frames": args.ref_frames,
        "prompt_positions": prompt.length,
        "cached_positions": prompt.prefix_len,
        "miss_prefill_ms": med(misses, "prefill_ms"),
        "hit_prefill_ms": med(hits, "prefill_ms"),
        "prompt_ms": med(misses + hits, "prompt_ms"),
        "max_abs_hidden_diff": diff,
        "same_greedy_code0": same_code0,
        "runs": {"hit": hits, "miss": misses},
    }
    summary["hit_over_miss"] = summary["hit_prefill_ms"] / summary["miss_prefill_ms"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(
        f"\nICL clone, {args.ref_frames} reference frames: {prompt.length} prompt positions, "
        f"{prompt.prefix_len} cached\nprefill median: miss {summary['miss_prefill_ms']:.1f} ms, "
        f"hit {summary['hit_prefill_ms']:.1f} ms, hit/miss x{summary['hit_over_miss']:.2f} "
        f"(prompt build {summary['prompt_ms']:.1f} ms in both)\n"
        f"hit vs miss: max |hidden diff| {diff:.2e}, same greedy code0: {same_code0}"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
