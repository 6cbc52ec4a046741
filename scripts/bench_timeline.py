"""Timeline of chunk emits against real-time playback, for 1..N concurrent streams.

For each concurrency level, N streams start together on one engine; every chunk's emit time and
duration are recorded. The plot shows, per stream, the audio received so far (steps) against what a
listener who starts at the first chunk has played (a 45-degree line): wherever the line would pass
the steps, playback stalls. Writes bench-results/timeline.json and bench-results/timeline.png.

    python scripts/bench_timeline.py [--model DIR | --size tiny|0.6b] [--streams 1,2,4] [--frames 40]
        [--quant none|int8] [--codec-dtype auto|float32|bfloat16]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from benchlib import at_once  # noqa: E402

from voxcast.config import EngineConfig  # noqa: E402
from voxcast.engine.engine import Engine  # noqa: E402
from voxcast.engine.timing import playback_stalls  # noqa: E402
from voxcast.testing.qwen3_tts import make_test_model  # noqa: E402


def run_level(engine: Engine, n: int, frames: int) -> list[dict[str, Any]]:
    def one(i: int) -> dict[str, Any]:
        stream = engine.synthesize(
            {"text": "Timeline test sentence.", "voice": "ryan", "seed": i, "max_frames": frames}
        )
        emits, durs, sizes = [], [], []
        for chunk in stream:
            emits.append(chunk.t_emit - stream.started_at)
            durs.append(chunk.duration_s)
            sizes.append(chunk.frames)
        stalls, stall_s = playback_stalls(emits, durs)
        return {
            "emits_s": emits,
            "durations_s": durs,
            "chunk_frames": sizes,
            "ttfa_ms": stream.timing.ttfa_ms,
            "stalls": stalls,
            "stall_s": stall_s,
        }

    return at_once(n, one)


def plot(levels: dict[int, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(levels), figsize=(5 * len(levels), 4), squeeze=False)
    for ax, (n, rows) in zip(axes[0], levels.items(), strict=True):
        for i, r in enumerate(rows):
            t = [0.0, *r["emits_s"]]
            got = [0.0]
            for d in r["durations_s"]:
                got.append(got[-1] + d)
            ax.step(t, got, where="post", label=f"stream {i} received" if n <= 4 else None)
            t0 = r["emits_s"][0]
            ax.plot([t0, t0 + got[-1]], [0, got[-1]], "--", color="grey", linewidth=0.8)
        ax.set_title(f"{n} concurrent stream(s)")
        ax.set_xlabel("wall time since request (s)")
        ax.set_ylabel("audio (s)")
        ax.legend(fontsize=7)
    fig.suptitle("chunks received (steps) vs real-time playback from the first chunk (dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a CustomVoice checkpoint dir instead of --size")
    ap.add_argument(
        "--size", default="tiny", choices=["tiny", "0.6b"], help="random CustomVoice model built here"
    )
    ap.add_argument("--quant", default="none", choices=["none", "int8"], help="VOXCAST_QUANT")
    ap.add_argument("--codec-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--no-ramp", action="store_true", help="fixed chunk schedule (first, then chunk_frames)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()
    model = args.model
    if model is None:
        path = ROOT / ".cache" / "bench-models" / f"{args.size}-custom_voice"
        if not (path / "config.json").exists():
            print(f"building random {args.size} custom_voice checkpoint in {path} ...", flush=True)
            make_test_model(path, "custom_voice", size=args.size, seed=0)
        model = str(path)
    config = EngineConfig(
        model=model,
        device="cpu",
        chunk_ramp=not args.no_ramp,
        quant=args.quant,
        codec_dtype=args.codec_dtype,
    )
    engine = Engine.load(config)
    levels: dict[int, list[dict[str, Any]]] = {}
    for n in (int(x) for x in args.streams.split(",")):
        t0 = time.perf_counter()
        levels[n] = run_level(engine, n, args.frames)
        wall = time.perf_counter() - t0
        agg = n * args.frames / wall
        ttfa = sorted(r["ttfa_ms"] for r in levels[n])
        stalls = sum(r["stalls"] for r in levels[n])
        stall_ms = 1000 * sum(r["stall_s"] for r in levels[n]) / n
        print(
            f"{n} stream(s): aggregate {agg:.1f} frames/s, TTFA median {ttfa[len(ttfa) // 2]:.0f} ms, "
            f"stalls {stalls} ({stall_ms:.0f} ms per stream); stream 0's chunks {levels[n][0]['chunk_frames']}"
        )
    engine.close()
    args.out.mkdir(parents=True, exist_ok=True)
    name = "timeline-fixed" if args.no_ramp else "timeline"
    doc = {
        "model": model,
        "frames": args.frames,
        "chunk_ramp": not args.no_ramp,
        "quant": args.quant,
        "codec_dtype": args.codec_dtype,
        "levels": levels,
    }
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    plot(levels, args.out / f"{name}.png")
    print(f"wrote {args.out / name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
