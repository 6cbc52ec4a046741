"""How many torch threads the engine's decode thread should use, measured.

The engine's scheduler thread generates frames (memory-bound matrix-vector products over the
talker's weights) while its decode thread runs the streaming codec decoder. Both default to torch's
full intra-op pool, which oversubscribes a small CPU. This runs the full-size codec decoder (from a
checkpoint's ``speech_tokenizer``) on a worker thread, one 4-frame chunk per 4 "generation steps",
against a stand-in generation step on the main thread (matrix-vector products over ``--gen-mb`` of
float32 weights), with the worker at each pool size in ``--decode-threads`` (0 = torch's default),
interleaved, and prints the step and chunk times. Nothing of the 0.6B talker is loaded.

    python scripts/bench_decode_threads.py [--model .cache/bench-models/0.6b-base] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from voxcast.engine.decode_stage import DecodeStage  # noqa: E402
from voxcast.models.qwen3_tts.codec_decoder import load_codec_decoder  # noqa: E402


def generation_weights(mb: int, width: int = 1024) -> list[torch.Tensor]:
    """Square-ish float32 matrices totalling ``mb`` MB: a stand-in for a talker's weights."""
    n = max(1, mb * 2**20 // (4 * width * 4 * width))
    return [torch.randn(4 * width, width) for _ in range(n)]


def gen_step(weights: list[torch.Tensor], x: torch.Tensor) -> None:
    for w in weights:
        torch.mv(w, x)


def run(codec: object, weights: list[torch.Tensor], threads: int, steps: int) -> dict[str, float]:
    """``steps`` generation steps on this thread, a 4-frame decode every 4 steps on the stage."""
    stage = DecodeStage(True, torch_threads=threads)
    stream = codec.new_stream()  # type: ignore[attr-defined]
    codes = torch.randint(0, 2048, (4, 16))
    chunk_s: list[float] = []

    def decode() -> None:
        t0 = time.perf_counter()
        stream.decode(codes)
        chunk_s.append(time.perf_counter() - t0)

    x = torch.randn(weights[0].shape[1])
    step_s = []
    t_all = time.perf_counter()
    with torch.inference_mode():
        for i in range(steps):
            if i % 4 == 0:
                stage.run(decode, print)
            t0 = time.perf_counter()
            gen_step(weights, x)
            step_s.append(time.perf_counter() - t0)
        stage.join()
    wall = time.perf_counter() - t_all
    return {
        "step_ms": 1000 * statistics.median(step_s),
        "chunk_ms": 1000 * statistics.median(chunk_s),
        "wall_ms": 1000 * wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / ".cache" / "bench-models" / "0.6b-base")
    ap.add_argument("--decode-threads", default="1,0")
    ap.add_argument("--gen-mb", type=int, default=400)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    codec = load_codec_decoder(args.model / "speech_tokenizer")
    weights = generation_weights(args.gen_mb)
    x = torch.randn(weights[0].shape[1])
    with torch.inference_mode():
        gen_step(weights, x)
        t0 = time.perf_counter()
        gen_step(weights, x)
        alone_step = (time.perf_counter() - t0) * 1000
        s = codec.new_stream()
        s.decode(torch.randint(0, 2048, (4, 16)))
        t0 = time.perf_counter()
        s.decode(torch.randint(0, 2048, (4, 16)))
        alone_chunk = (time.perf_counter() - t0) * 1000
    print(
        f"alone: step {alone_step:.0f} ms, 4-frame chunk {alone_chunk:.0f} ms (torch threads {torch.get_num_threads()})"
    )
    rows: dict[int, list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for n in (int(v) for v in args.decode_threads.split(",")):
            rows.setdefault(n, []).append(run(codec, weights, n, args.steps))
            print(f"round {r} decode threads {n or 'default'}: {rows[n][-1]}", flush=True)
    for n, rs in rows.items():
        med = {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]}
        print(f"decode threads {n or 'default'} (medians): {med}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
