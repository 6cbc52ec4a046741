"""Start-up benchmark: how long a fresh process takes until its engine serves, and where the time goes.

A serverless worker scaled from zero, or an RQ worker restarted, serves nothing until its engine is
loaded and warmed (``Engine.load``), so this is a cold start's floor. Each measurement is a fresh
process (imports included) that loads the engine on a random-weight checkpoint (``--size``, built
once and cached, as bench_engine.py does) and reports:
  import_ms  importing torch and voxcast;   load_ms  the engine's load (weights, int8 packing);
  warmup_ms  the engine's warm-up (recorded code-predictor steps for every batch size, one request
             per path, the decode-thread calibration);   ready_ms  process start to engine ready;
  quant_s, trace_s  the int8 packing and the recordings inside them (from the engine's log);
  rss_mb  resident memory once ready.
With ``--baseline REV`` the same runs for ``src/`` of that git revision, alternated run by run, and the
ratios current / baseline. Prints a table and writes bench-results/startup-<size>.json.

    python scripts/bench_startup.py [--size 0.6b] [--quant int8] [--runs 3] [--baseline HEAD~2]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
KEYS = ("import_ms", "load_ms", "warmup_ms", "ready_ms", "quant_s", "trace_s", "rss_mb")


class _Phases(logging.Handler):
    """Adds up the durations the engine logs for int8 packing and code-predictor recordings."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.quant_s = 0.0
        self.trace_s = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        m = re.search(r" in ([0-9.]+) s$", msg)
        if m is None:
            return
        if msg.startswith("recorded code-predictor steps"):
            self.trace_s += float(m.group(1))
        elif "quantized to int8" in msg:
            self.quant_s += float(m.group(1))


def worker(args: argparse.Namespace) -> dict[str, Any]:
    phases = _Phases()
    logging.getLogger("voxcast").addHandler(phases)
    logging.getLogger("voxcast").setLevel(logging.INFO)
    import torch  # noqa: F401

    from voxcast.config import EngineConfig
    from voxcast.engine.engine import Engine
    from voxcast.memory import rss_mb

    t_import = time.perf_counter()
    engine = Engine.load(EngineConfig(model=args.model, device="cpu", quant=args.quant))
    out = {
        "import_ms": (t_import - T_START) * 1000,
        "load_ms": engine.load_ms,
        "warmup_ms": engine.warmup_ms,
        "ready_ms": (time.perf_counter() - T_START) * 1000,
        "quant_s": phases.quant_s,
        "trace_s": phases.trace_s,
        "rss_mb": rss_mb(),
        "decode_calibration": engine.decode_calibration,
    }
    engine.close()
    return out


def _run(src: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--quant", args.quant]
    env = dict(os.environ, PYTHONPATH=str(src))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"worker failed:\n{res.stderr[-3000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--model", help="a checkpoint directory instead of --size")
    ap.add_argument("--quant", default="int8", choices=["none", "int8"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", help="git revision to compare against (its src/, alternated)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    from bench_decode import _extract
    from benchlib import checkpoint

    args.model = args.model or str(checkpoint(args.size))
    variants = {"current": ROOT / "src"}
    tmp = tempfile.TemporaryDirectory()
    if args.baseline:
        variants["baseline"] = _extract(args.baseline, Path(tmp.name))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for rep in range(args.runs):
        order = list(variants) if rep % 2 == 0 else list(variants)[::-1]
        for name in order:
            r = _run(variants[name], args)
            runs[name].append(r)
            print(f"rep {rep} {name:8s} " + "  ".join(f"{k} {r[k]:.0f}" for k in KEYS), flush=True)
    summary = {name: {k: statistics.median(r[k] for r in rs) for k in KEYS} for name, rs in runs.items()}
    print(f"\nmedians of {args.runs} runs ({args.model}, quant {args.quant})")
    print("variant   " + "".join(f"{k:>11s}" for k in KEYS))
    for name, s in summary.items():
        print(f"{name:10s}" + "".join(f"{s[k]:11.1f}" for k in KEYS))
    if "baseline" in summary:
        cur, base = summary["current"], summary["baseline"]
        ratios = {k: cur[k] / base[k] for k in KEYS if base[k]}
        summary["current/baseline"] = ratios
        print("ratio     " + "".join(f"{ratios.get(k, float('nan')):11.2f}" for k in KEYS))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"startup-{args.size}.json"
    result = {
        "model": args.model,
        "quant": args.quant,
        "baseline": args.baseline,
        "summary": summary,
        "runs": runs,
    }
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
