"""Chatterbox Turbo's streamed S3Gen + HiFT for N concurrent streams: every stream's
flow windows one by one (``TurboDecoder.decode`` per stream, as with ``VOXCAST_TURBO_BATCH_WINDOWS=off``)
against one batched call per round (``ChatterboxTurbo.decode_many``, the engine's path with it on).

N streams (voices alternating between two cloned ones of different reference lengths unless
``--one-voice``) get random speech tokens ``--push`` at a time, round after round, then finish; each
round is timed (device synchronised). Printed and written as JSON: total and per-round wall time of
both modes, the rounds that ran flow windows, and the max abs difference of the two modes' audio
(float rounding of the batched flow's other matrix shapes).

    python scripts/bench_turbo_batch_windows.py [--size full|tiny] [--device cuda] [--dtype bfloat16]
        [--streams 4] [--seconds 6] [--push 4] [--prompt-cache 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from benchlib import machine_info, turbo_checkpoint, use_checkout, write_json  # noqa: E402

use_checkout()

from voxcast.models.base import LoadOptions  # noqa: E402
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo  # noqa: E402
from voxcast.testing.signals import speech_like  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(
    model: ChatterboxTurbo, voices: list[Any], tokens: list[list[int]], push: int, batched: bool
) -> tuple[list[float], list[np.ndarray], int]:
    """All streams' tokens ``push`` at a time per round, then finish: each round's wall ms, each
    stream's audio, and the flow windows run."""
    decoders = [model.new_decoder(voices[i % len(voices)], seed=7 + i) for i in range(len(tokens))]
    audio: list[list[np.ndarray]] = [[] for _ in decoders]
    costs = []
    for r in range(0, max(len(t) for t in tokens), push):
        live = [i for i, t in enumerate(tokens) if r < len(t)]
        chunks = [torch.tensor(tokens[i][r : r + push])[:, None] for i in live]
        t0 = time.perf_counter()
        if batched:
            outs = model.decode_many([decoders[i] for i in live], chunks)
        else:
            outs = [decoders[i].decode(c) for i, c in zip(live, chunks, strict=True)]
        sync(model.device)
        costs.append((time.perf_counter() - t0) * 1000)
        for i, out in zip(live, outs, strict=True):
            assert isinstance(out, np.ndarray), out
            audio[i].append(out)
    for i, d in enumerate(decoders):
        audio[i].append(d.finish())
    windows = sum(len(d.stream.flow_calls) for d in decoders)
    return costs, [np.concatenate(a) for a in audio], windows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6.0, help="audio per stream")
    ap.add_argument("--push", type=int, default=4, help="tokens per stream per round")
    ap.add_argument("--prompt-cache", type=int, default=1, choices=[0, 1])
    ap.add_argument("--one-voice", action="store_true", help="every stream in one voice")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "turbo-batch-windows.json")
    args = ap.parse_args()
    torch.set_flush_denormal(True)  # random weights drive HiFT into denormals
    folder = turbo_checkpoint(args.size)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    settings = (("turbo_prompt_cache", args.prompt_cache),)
    opts = LoadOptions(device=args.device, dtype=dtype, codec_dtype=dtype, settings=settings)
    model = ChatterboxTurbo.from_pretrained(folder, opts)
    refs = (10.0,) if args.one_voice else (10.0, 7.0)
    voices = [
        model.make_voice(speech_like(s, 24000, seed=9 + k), 24000, None, False) for k, s in enumerate(refs)
    ]
    for v in voices:
        model.prime_voice(v)
    g = torch.Generator().manual_seed(1)
    n = int(args.seconds * 25)
    tokens = [torch.randint(0, 6561, (n - 3 * i,), generator=g).tolist() for i in range(args.streams)]

    doc: dict[str, Any] = {
        "machine": machine_info(),
        "config": {k: str(v) for k, v in vars(args).items()},
        "device": str(model.device),
    }
    audio = {}
    for batched in (False, True):
        run(model, voices, tokens, args.push, batched)  # warm: kernels chosen, allocator filled
        costs, audio[batched], windows = run(model, voices, tokens, args.push, batched)
        name = "batched" if batched else "one_by_one"
        doc[name] = {
            "total_ms": round(sum(costs), 1),
            "round_ms_median": round(sorted(costs)[len(costs) // 2], 1),
            "round_ms_max": round(max(costs), 1),
            "rounds": len(costs),
            "flow_windows": windows,
            "round_ms": [round(c, 1) for c in costs],
        }
        print(
            f"{name:10s}: {sum(costs):8.0f} ms total, {len(costs)} rounds (median {doc[name]['round_ms_median']:.0f}, "
            f"max {doc[name]['round_ms_max']:.0f} ms), {windows} flow windows",
            flush=True,
        )
    diff = max(float(np.abs(a - b).max()) for a, b in zip(audio[False], audio[True], strict=True))
    doc["max_abs_diff"] = diff
    doc["speedup"] = round(doc["one_by_one"]["total_ms"] / doc["batched"]["total_ms"], 3)
    print(
        f"{args.streams} streams, {args.size} on {model.device} ({args.dtype}), prompt cache {args.prompt_cache}: "
        f"batched / one by one {1 / doc['speedup']:.2f}x the time; audio max |diff| {diff:.2e}"
    )
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
