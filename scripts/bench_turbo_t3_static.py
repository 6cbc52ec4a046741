"""T3's decode step, eager (growing caches, ``next``/``next_many``) against the static step
(:mod:`voxcast.models.chatterbox_turbo.t3_static`: fixed-shape cache, batched; a CUDA graph per batch
bucket on CUDA), in one run on one machine: ms per step and per token for 1 and several streams, and
whether the greedy tokens agree.

    python scripts/bench_turbo_t3_static.py [--size full] [--device cuda --dtype bfloat16] [--streams 1,4]
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

from voxcast.models.base import LoadOptions  # noqa: E402
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo  # noqa: E402
from voxcast.models.chatterbox_turbo.sampling import TurboSampling  # noqa: E402
from voxcast.models.chatterbox_turbo.t3 import TokenStream, next_many  # noqa: E402
from voxcast.models.chatterbox_turbo.t3_static import StaticT3  # noqa: E402

TEXTS = [
    "Thank you for calling the support line.",
    "Your call matters to us, so please stay on the line.",
    "An agent will be with you shortly.",
    "Press one to hear these options again.",
]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def streams(model: ChatterboxTurbo, n: int, tokens: int) -> list[TokenStream]:
    out = []
    for i in range(n):
        p = model.build_prompt(TEXTS[i % len(TEXTS)])
        s = model.t3.stream(
            p.text_ids, prefix=p.prefix, sampling=TurboSampling(greedy=True), seed=i, max_tokens=tokens + 1
        )
        s.next()  # prefill and the first token: not timed
        out.append(s)
    return out


def run(model: ChatterboxTurbo, n: int, tokens: int, static: StaticT3 | None) -> dict[str, Any]:
    ss = streams(model, n, tokens)
    if static is not None:
        for s in ss:
            assert static.admit(s) is not None
    device = model.device
    sync(device)
    t0 = time.perf_counter()
    for _ in range(tokens):
        if static is not None:
            static.step(ss)
        elif n == 1:
            ss[0].next()
        else:
            next_many(model.t3, ss)
    sync(device)
    ms = (time.perf_counter() - t0) * 1000 / tokens
    return {"ms_per_step": ms, "ms_per_token": ms / n, "tokens": [[int(t) for t in s.tokens] for s in ss]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", choices=["full", "tiny"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--tokens", type=int, default=40, help="timed steps per run")
    ap.add_argument("--length", type=int, default=2048, help="static cache positions per slot")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "turbo-t3-static.json")
    args = ap.parse_args()
    from bench_chatterbox_turbo import build

    folder = build(ROOT / ".cache" / "bench-models" / f"turbo-{args.size}-nostop", args.size)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    model = ChatterboxTurbo.from_pretrained(folder, LoadOptions(device=args.device, dtype=dtype))
    counts = [int(n) for n in args.streams.split(",")]
    doc: dict[str, Any] = {"machine": machine_info(), "config": {k: str(v) for k, v in vars(args).items()}}
    graphs = model.device.type == "cuda"
    t0 = time.perf_counter()
    static = StaticT3(model.t3, max(counts), args.length, graphs=graphs)
    static.capture()
    doc["static_ready_s"] = time.perf_counter() - t0
    run(model, 1, 4, None)  # warm both paths
    run(model, 1, 4, static)
    for n in counts:
        eager, fixed = run(model, n, args.tokens, None), run(model, n, args.tokens, static)
        same = eager.pop("tokens") == fixed.pop("tokens")
        doc[str(n)] = {"eager": eager, "static": fixed, "static_over_eager": fixed["ms_per_step"] / eager["ms_per_step"], "greedy_tokens_equal": same}  # fmt: skip
        print(
            f"{n} stream(s): eager {eager['ms_per_token']:.2f} ms/token, static {fixed['ms_per_token']:.2f} "
            f"ms/token (static / eager {doc[str(n)]['static_over_eager']:.2f}); greedy tokens equal: {same}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
