"""Idle unload: resident memory loaded / after unload / after reload, and what a cold request pays.

Loads a random-weight checkpoint (``--size``; built once and cached) with ``idle_unload_s``, serves
one request, waits for the unload, then serves one more (the reload) and prints/writes the figures:
RSS with the model loaded, after the unload (heap trimmed), after the reload; the cold request's
load, warm-up and first audio against a warm request's first audio.

    python scripts/bench_unload.py [--size tiny|0.6b] [--quant int8] [--warmup]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from benchlib import checkpoint, cpu_name, machine_info, use_checkout  # noqa: E402

use_checkout()


from voxcast.config import EngineConfig  # noqa: E402
from voxcast.engine.engine import Engine  # noqa: E402
from voxcast.memory import rss_mb  # noqa: E402


def say(engine: Engine) -> dict[str, float]:
    stream = engine.synthesize(
        {"text": "Thank you for calling.", "voice": "ryan", "seed": 1, "max_frames": 8}
    )
    for _ in stream:
        pass
    t = stream.timing
    return {
        "cold": t.cold,
        "ttfa_ms": round(t.ttfa_ms, 1),
        "load_ms": round(t.load_ms, 1),
        "warmup_ms": round(t.warmup_ms, 1),
    }


def gpu_mb() -> dict[str, float] | None:
    """CUDA memory allocated and reserved by this process (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    mib = 1024 * 1024
    return {
        "allocated": round(torch.cuda.memory_allocated() / mib, 1),
        "reserved": round(torch.cuda.memory_reserved() / mib, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b"])
    ap.add_argument("--quant", default="none")
    ap.add_argument("--warmup", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--idle-s", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()
    config = EngineConfig(
        model=str(checkpoint(args.size, "custom_voice")), device=args.device, quant=args.quant,
        warmup=args.warmup, idle_unload_s=args.idle_s,
    )  # fmt: skip
    t0 = time.perf_counter()
    engine = Engine.load(config)
    first_load_ms = (time.perf_counter() - t0) * 1000
    warm = say(engine)
    warm_again = say(engine)
    loaded, gpu_loaded = rss_mb(), gpu_mb()
    while engine.unloads == 0:
        time.sleep(0.05)
    unloaded, gpu_unloaded = rss_mb(), gpu_mb()
    cold = say(engine)
    reloaded, gpu_reloaded = rss_mb(), gpu_mb()
    engine.close()
    doc = {
        "machine": {**machine_info(), "cpu": cpu_name()},
        "args": {k: str(v) for k, v in vars(args).items()},
        "first_load_ms": round(first_load_ms, 1),
        "rss_mb": {"loaded": loaded, "after_unload": unloaded, "after_reload": reloaded},
        "cuda_mb": {"loaded": gpu_loaded, "after_unload": gpu_unloaded, "after_reload": gpu_reloaded},
        "unload": engine.last_unload,
        "warm_request": warm_again,
        "first_request": warm,
        "cold_request": cold,
    }
    print(json.dumps(doc, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ("-" + args.quant if args.quant != "none" else "") + (
        "-" + args.device if args.device != "cpu" else ""
    )
    out = args.out / f"unload-{args.size}{suffix.replace(':', '')}.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
