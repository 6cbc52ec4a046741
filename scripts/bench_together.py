"""First audio of N streams started together: whole texts vs text in pieces, burst admission on and off.

N threads start N requests at the same instant on one engine (a CustomVoice checkpoint with random
weights, ``--size``), each a short sentence for ``--frames`` frames, and time each stream's first
chunk from its start:

- ``whole``: ``engine.synthesize`` (the HTTP API, RunPod, RQ);
- ``pieces``: ``engine.open`` with the text pushed and closed at once (the WebSocket's streams).

Each mode runs with ``burst_admit`` on and off (``--burst``; the same engine, the setting switched
between runs), interleaved, ``--reps`` times. Off, requests are admitted and prefilled one per
scheduler round, so the later ones wait behind the earlier ones' first frames; on, requests that
arrive before anyone's first frame are prefilled whole in the same round. Prints first audio p50 and
the last stream's, per mode and setting; writes ``bench-results/together-<size>.json``.

    python scripts/bench_together.py [--size tiny|0.6b] [--quant int8] [--streams 4,8] [--reps 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from benchlib import at_once, checkpoint, cpu_name, machine_info, use_checkout  # noqa: E402

use_checkout()


from voxcast.config import EngineConfig  # noqa: E402
from voxcast.engine.engine import Engine  # noqa: E402

TEXT = "Thank you for calling."


def run_together(engine: Engine, mode: str, n: int, frames: int, seed0: int) -> list[float]:
    """Start ``n`` streams at once; each one's first audio (ms from its own start), in start order."""

    def one(i: int) -> float:
        request = {"text": TEXT, "voice": "ryan", "max_frames": frames, "seed": seed0 + i}
        t0 = time.perf_counter()
        if mode == "whole":
            stream = engine.synthesize(request)
        else:
            stream = engine.open(request)
            stream.close_text()
        it = iter(stream)
        next(it)
        first = (time.perf_counter() - t0) * 1000
        for _ in it:
            pass
        return first

    return at_once(n, one)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", choices=["tiny", "0.6b"])
    ap.add_argument("--quant", default="none")
    ap.add_argument("--streams", default="4,8")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--burst", default="on,off", help="burst_admit settings to compare (on, off)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    bursts = [b.strip() == "on" for b in args.burst.split(",")]

    cfg = EngineConfig(
        model=str(checkpoint(args.size, "custom_voice")),
        device="cpu",
        quant=args.quant,
        max_active=max(levels),
        warmup=True,
    )
    engine = Engine.load(cfg)
    rows: dict[str, list[float]] = {}
    last: dict[str, list[float]] = {}
    try:
        run_together(engine, "whole", 1, 2, 0)  # first requests outside the timed part
        run_together(engine, "pieces", 1, 2, 0)
        for rep in range(args.reps):
            for n in levels:
                for mode in ("whole", "pieces"):
                    order = bursts if rep % 2 == 0 else bursts[::-1]  # alternated: drift falls alike
                    for burst in order:
                        engine.config = dataclasses.replace(cfg, burst_admit=burst)
                        firsts = run_together(engine, mode, n, args.frames, 1000 * rep + 10 * n)
                        key = f"{mode}/{n}/burst_{'on' if burst else 'off'}"
                        rows.setdefault(key, []).extend(firsts)
                        last.setdefault(key, []).append(max(firsts))
    finally:
        engine.config = cfg
        engine.close()

    results = {
        key: {
            "ttfa_ms_p50": round(statistics.median(v), 1),
            "last_ttfa_ms_median": round(statistics.median(last[key]), 1),
            "ttfa_ms": [round(x, 1) for x in v],
        }
        for key, v in rows.items()
    }
    print(f"\nCPU: {cpu_name()}  model: {args.size} custom_voice  quant: {args.quant}  frames: {args.frames}")
    print(f"{'mode':<7} {'N':>3} {'burst':>6} {'first audio p50':>16} {'last stream':>12}")
    for key, r in results.items():
        mode, n, burst = key.split("/")
        print(
            f"{mode:<7} {n:>3} {burst[6:]:>6} {r['ttfa_ms_p50']:>14.1f}ms {r['last_ttfa_ms_median']:>10.1f}ms"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"together-{args.size}{'-' + args.quant if args.quant != 'none' else ''}.json"
    doc = {"machine": {**machine_info(), "cpu": cpu_name()}, "args": vars(args) | {"out": str(args.out)}}
    out.write_text(json.dumps(doc | {"results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
