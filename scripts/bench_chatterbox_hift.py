"""HiFT streaming strategies on a random full-size HiFT (Chatterbox Turbo's vocoder), one run:

(a) independent chunks: each chunk decoded alone (its own pitch, phases from zero), the founding
    experiment; (b) re-decode everything so far at every flush and join with a 12 ms crossfade, fresh
    source noise per decode (the approach of upstream PR #528); (c) voxcast's ``HiFTStream``: a window
    of left/right context per chunk, pitch and phase carried, noise pinned.

Against the one-pass decode of the whole mel (with (c)'s noise; (a) gets the same noise, restarted
phases): max abs difference, SNR, a boundary-discontinuity figure (mean |x[n] - x[n-1]| across chunk
boundaries over the one-pass decode's at the same samples: 1 = no seam) and the compute per chunk (first, last, ratio).

    python scripts/bench_chatterbox_hift.py [--seconds 20] [--chunk 48] [--size full|tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
from benchlib import machine_info, use_checkout  # noqa: E402

use_checkout()


from voxcast.models.chatterbox_turbo.hift import SAMPLES_PER_FRAME, HiFT, SourceNoise  # noqa: E402
from voxcast.models.chatterbox_turbo.hift_stream import HiFTStream  # noqa: E402
from voxcast.testing.chatterbox_turbo import hift_state  # noqa: E402

CROSSFADE = int(0.012 * 24000)


def metrics(
    streamed: torch.Tensor, ref: torch.Tensor, bounds: list[int], costs: list[float], finish_s: float = 0.0
) -> dict[str, Any]:
    """``costs``: compute per chunk pushed; ``finish_s``: the final flush."""
    err = streamed - ref
    at = torch.tensor([b - 1 for b in bounds if 0 < b < streamed.shape[0]])
    jump = (streamed[1:] - streamed[:-1]).abs()[at]
    ref_jump = (ref[1:] - ref[:-1]).abs()[at]
    return {
        "max_abs_diff": float(err.abs().max()),
        "snr_db": float(10 * torch.log10(ref.pow(2).sum() / err.pow(2).sum().clamp_min(1e-30))),
        "boundary_jump_ratio": float(jump.mean() / ref_jump.mean()) if len(at) else None,
        "chunk_ms_first": costs[0] * 1000,
        "chunk_ms_median": sorted(costs)[len(costs) // 2] * 1000,
        "chunk_ms_last": costs[-1] * 1000,
        "last_over_first": costs[-1] / costs[0],
        # the first chunk's window has no left context yet: the second is the first full-size window
        "last_over_second": costs[-1] / costs[1] if len(costs) > 1 else None,
        "chunk_ms": [round(c * 1000, 1) for c in costs],
        "total_s": sum(costs) + finish_s,
        "finish_ms": finish_s * 1000,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--chunk", type=int, default=48, help="mel frames a chunk (2 per speech token)")
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--left", type=int, default=16)
    ap.add_argument("--right", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "chatterbox-hift.json")
    args = ap.parse_args()
    torch.set_flush_denormal(True)  # random weights drive HiFT into denormals (30x slower)
    hift = HiFT.from_tensors(hift_state(args.size, seed=5))
    frames = int(args.seconds * 50)
    mel = torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(1)) - 4.0
    starts = list(range(0, frames, args.chunk))
    with torch.inference_mode():  # first calls create the convolutions' primitives: not timed
        warm = HiFTStream(hift, generator=torch.Generator().manual_seed(0), left=args.left, right=args.right)
        for s in starts[:3]:
            warm.push(mel[..., s : s + args.chunk])
        warm.finish()
        hift.inference(mel[..., : args.chunk], torch.Generator().manual_seed(0))
    bounds = [s * SAMPLES_PER_FRAME for s in starts[1:]]

    # (c) ours
    stream = HiFTStream(hift, generator=torch.Generator().manual_seed(3), left=args.left, right=args.right)
    parts, costs_c = [], []
    for s in starts:
        t0 = time.perf_counter()
        parts.append(stream.push(mel[..., s : s + args.chunk]))
        costs_c.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    parts.append(stream.finish())
    finish_c = time.perf_counter() - t0
    ours = torch.cat(parts)
    noise = stream.noise
    with torch.inference_mode():
        t0 = time.perf_counter()
        ref = hift.decode(mel, hift.source(hift.f0(mel), noise))[0]
        one_pass_s = time.perf_counter() - t0

    # (a) independent chunks (same noise, phases restarted per chunk)
    parts, costs_a = [], []
    with torch.inference_mode():
        for s in starts:
            t0 = time.perf_counter()
            m = mel[..., s : s + args.chunk]
            sl = slice(s * SAMPLES_PER_FRAME, (s + m.shape[-1]) * SAMPLES_PER_FRAME)
            parts.append(
                hift.decode(m, hift.source(hift.f0(m), SourceNoise(noise.phases, noise.noise[..., sl])))[0]
            )
            costs_a.append(time.perf_counter() - t0)
    independent = torch.cat(parts)

    # (b) re-decode everything at every flush, 12 ms crossfade, fresh noise per decode
    fade = torch.linspace(0, 1, CROSSFADE)
    out: list[torch.Tensor] = []
    held, sent, costs_b = None, 0, []
    g = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        for k, s in enumerate(starts):
            t0 = time.perf_counter()
            n = min(frames, s + args.chunk)
            audio = hift.inference(mel[..., :n], g)[0]
            last = k == len(starts) - 1
            new = audio[sent:] if last else audio[sent : n * SAMPLES_PER_FRAME - CROSSFADE]
            if held is not None:
                new = new.clone()
                new[:CROSSFADE] = held * (1 - fade) + new[:CROSSFADE] * fade
            out.append(new)
            sent += new.shape[0]
            held = None if last else audio[n * SAMPLES_PER_FRAME - CROSSFADE : n * SAMPLES_PER_FRAME]
            costs_b.append(time.perf_counter() - t0)
    redecode = torch.cat(out)

    doc = {
        "machine": machine_info(),
        "config": {k: str(v) for k, v in vars(args).items()},
        "frames": frames,
        "one_pass_s": one_pass_s,
        "a_independent": metrics(independent, ref, bounds, costs_a),
        "b_redecode_crossfade": metrics(redecode, ref, bounds, costs_b),
        "c_voxcast": metrics(ours, ref, bounds, costs_c, finish_c),
    }
    print(
        f"{args.size} HiFT, {args.seconds:.0f} s ({frames} mel frames), chunks of {args.chunk}; one pass {one_pass_s:.2f} s"
    )
    print(
        "strategy                  max|diff|   SNR dB  boundary jump  chunk ms first/median/last (last/2nd)  total s"
    )
    for name in ("a_independent", "b_redecode_crossfade", "c_voxcast"):
        m = doc[name]
        jump = m["boundary_jump_ratio"]
        print(
            f"{name:24s}  {m['max_abs_diff']:9.2e}  {m['snr_db']:7.1f}  {jump if jump is None else round(jump, 2)!s:>13}"
            f"  {m['chunk_ms_first']:6.0f} / {m['chunk_ms_median']:6.0f} / {m['chunk_ms_last']:6.0f} ({m['last_over_second']:5.2f})"
            f"  {m['total_s']:7.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
