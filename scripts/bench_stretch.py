"""Cost of the speaking-rate stretch (``speed``): ms of CPU per second of output audio, streamed in
80 ms chunks as the engine emits them, for a few speeds; writes ``bench-results/stretch.json``.

    python scripts/bench_stretch.py [--seconds 10] [--speeds 0.5,0.75,1.25,1.5,2,4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from benchlib import cpu_name, machine_info  # noqa: E402

from voxcast.audio.stretch import TimeStretch  # noqa: E402
from voxcast.testing.signals import speech_like  # noqa: E402

SR, CHUNK = 24000, 1920


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--speeds", default="0.5,0.75,1.25,1.5,2,4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "stretch.json")
    args = ap.parse_args()
    x = speech_like(args.seconds).astype(np.float32)
    results = {}
    print(f"CPU: {cpu_name()}  input: {args.seconds:g} s at {SR} Hz in {CHUNK}-sample chunks")
    for speed in (float(s) for s in args.speeds.split(",")):
        best = float("inf")
        for _ in range(args.reps):
            ts, n = TimeStretch(speed, SR), 0
            t0 = time.perf_counter()
            for i in range(0, len(x), CHUNK):
                n += len(ts.process(x[i : i + CHUNK]))
            n += len(ts.finish())
            best = min(best, time.perf_counter() - t0)
        per_s = best * 1000 / (n / SR)
        results[str(speed)] = {
            "output_s": n / SR,
            "ms": round(best * 1000, 2),
            "ms_per_output_s": round(per_s, 2),
        }
        print(
            f"speed {speed:<5g} output {n / SR:6.2f} s  {best * 1000:7.1f} ms  {per_s:5.2f} ms per output second"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": {**machine_info(), "cpu": cpu_name()}, "results": results}, indent=1)
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
