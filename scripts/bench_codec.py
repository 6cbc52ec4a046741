"""Benchmark the stateful streaming codec decoder against naive left-context re-decoding.

For chunk sizes 1, 2, 4, 8 frames, decodes the same random codes two ways and reports the cost per
frame (ms) and the real-time factor of the decode alone (1 frame = 80 ms of audio):

- ``stateful``: :class:`StreamingDecoder` (conv tails + sliding-window KV cache): exact, O(new frames).
- ``naive``: re-decode each chunk with ``--context`` frames of left context (25, as faster-qwen3-tts)
  and keep the new samples: approximate (the error vs the exact decode is reported) and
  O(context + new frames).

Also reports priming (reference codes through the decoder once per voice) and cloning a primed
state (once per request). Random weights: tiny by default, full size with ``--full`` (config from
``--config``, the real speech tokenizer ``config.json``). Prints a table and writes JSON to
``bench-results/``.

    OMP_NUM_THREADS=2 python scripts/bench_codec.py [--full] [--frames 48] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxcast.models.qwen3_tts.codec_decoder import SAMPLES_PER_FRAME, CodecDecoder, CodecDecoderConfig
from voxcast.models.qwen3_tts.codec_encoder import speech_tokenizer_config

DEFAULT_CONFIG = Path("/work/shared/qwen3-tts-reference/common/speech_tokenizer/config.json")
FRAME_MS = 1000.0 * SAMPLES_PER_FRAME / 24000


def _decoder(full: bool, config: Path, seed: int, dtype: torch.dtype) -> CodecDecoder:
    raw = (
        json.loads(config.read_text())
        if full and config.is_file()
        else speech_tokenizer_config("full" if full else "tiny")
    )
    torch.manual_seed(seed)
    dec = CodecDecoder(CodecDecoderConfig.from_dict(raw["decoder_config"]))
    with torch.no_grad():
        for name, p in dec.named_parameters():
            if name.endswith("embedding_sum"):
                p.normal_()
    return dec.to(dtype).eval()


def _stateful(dec: CodecDecoder, codes: torch.Tensor, chunk: int) -> tuple[float, np.ndarray]:
    stream = dec.new_stream()
    out = []
    t0 = time.perf_counter()
    for i in range(0, codes.shape[0], chunk):
        out.append(stream.decode(codes[i : i + chunk]))
    return time.perf_counter() - t0, np.concatenate(out)


def _naive(dec: CodecDecoder, codes: torch.Tensor, chunk: int, context: int) -> tuple[float, np.ndarray]:
    out = []
    t0 = time.perf_counter()
    for i in range(0, codes.shape[0], chunk):
        start = max(0, i - context)
        wav = dec.decode_offline(codes[start : i + chunk])
        out.append(wav[(i - start) * SAMPLES_PER_FRAME :])
    return time.perf_counter() - t0, np.concatenate(out)


def _priming(dec: CodecDecoder, ref_frames: int) -> dict[str, float]:
    ref = torch.randint(0, 2048, (ref_frames, 16))
    t0 = time.perf_counter()
    base = dec.new_stream(ref)
    t1 = time.perf_counter()
    for _ in range(100):
        base.clone()
    t2 = time.perf_counter()
    return {"ref_frames": ref_frames, "prime_ms": 1000 * (t1 - t0), "clone_us": 1e6 * (t2 - t1) / 100}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every measurement; returns the JSON-able result."""
    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    dec = _decoder(args.full, args.config, args.seed, dtype)
    codes = torch.randint(0, 2048, (args.frames, 16), generator=torch.Generator().manual_seed(args.seed))
    exact = dec.decode_offline(codes)
    _stateful(dec, codes[:8], 4)  # warm-up
    rows = []
    for chunk in args.chunks:
        t_s, wav_s = _stateful(dec, codes, chunk)
        t_n, wav_n = _naive(dec, codes, chunk, args.context)
        rows.append(
            {
                "chunk_frames": chunk,
                "stateful_ms_per_frame": 1000 * t_s / args.frames,
                "naive_ms_per_frame": 1000 * t_n / args.frames,
                "speedup": t_n / t_s,
                "stateful_rtf": (1000 * t_s / args.frames) / FRAME_MS,
                "stateful_max_err": float(np.abs(wav_s - exact).max()),
                "naive_max_err": float(np.abs(wav_n - exact).max()),
            }
        )
        r = rows[-1]
        print(
            f"  chunk {chunk}: {r['stateful_ms_per_frame']:.1f} vs {r['naive_ms_per_frame']:.1f} ms/frame",
            file=sys.stderr,
            flush=True,
        )
    return {
        "size": "full" if args.full else "tiny",
        "dtype": args.dtype,
        "frames": args.frames,
        "context_frames": args.context,
        "threads": args.threads,
        "params_m": sum(p.numel() for p in dec.parameters()) / 1e6,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "loadavg_1m": os.getloadavg()[0],  # the machine may be shared: figures scale with load
        "rows": rows,
        "priming": _priming(dec, args.ref_frames),
    }


def _print(res: dict[str, Any]) -> None:
    print(
        f"codec decoder ({res['size']}, {res['params_m']:.1f}M params, {res['dtype']}, "
        f"{res['threads']} threads, {res['frames']} frames; naive = {res['context_frames']} frames of left context)"
    )
    print(
        f"{'chunk':>5} {'stateful ms/fr':>15} {'naive ms/fr':>12} {'speedup':>8} {'rtf':>6} {'naive err':>10}"
    )
    for r in res["rows"]:
        print(
            f"{r['chunk_frames']:>5} {r['stateful_ms_per_frame']:>15.2f} {r['naive_ms_per_frame']:>12.2f} "
            f"{r['speedup']:>7.1f}x {r['stateful_rtf']:>6.3f} {r['naive_max_err']:>10.2e}"
        )
    p = res["priming"]
    print(
        f"priming {p['ref_frames']} reference frames: {p['prime_ms']:.1f} ms; clone: {p['clone_us']:.1f} us"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="full-size random weights (default: tiny)")
    ap.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help="speech tokenizer config.json (--full)"
    )
    ap.add_argument("--frames", type=int, default=48, help="frames decoded per measurement")
    ap.add_argument("--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    ap.add_argument("--context", type=int, default=25, help="left-context frames of the naive re-decode")
    ap.add_argument("--ref-frames", type=int, default=38, help="reference frames for priming (38 = 3 s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    args = ap.parse_args()
    res = run(args)
    _print(res)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"codec-{res['size']}-{res['dtype']}.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
