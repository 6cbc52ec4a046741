"""Benchmark the stateful streaming codec decoder: per-frame cost, before/after, vs naive re-decoding.

For chunk sizes 1, 2, 4, 8 frames, decodes the same random codes two ways and reports the cost per
frame (ms) and the real-time factor of the decode alone (1 frame = 80 ms of audio):

- ``stateful``: :class:`StreamingDecoder` (conv tails + sliding-window KV cache): exact, O(new frames).
- ``naive``: re-decode each chunk with ``--context`` frames of left context (25, as faster-qwen3-tts)
  and keep the new samples: approximate (the error vs the exact decode is reported) and
  O(context + new frames).

Also reports priming (reference codes through the decoder once per voice) and cloning a primed
state (once per request). Random weights: tiny by default, full size with ``--full`` (config from
``--config``, the real speech tokenizer ``config.json``).

Each variant runs in its own subprocess (``--worker``): the working tree at each ``--dtypes`` entry
and, with ``--baseline REV``, ``src/`` of that git revision (extracted to a temporary folder) at the
first dtype, interleaved rep by rep, so that before/after is a ratio measured in the same run (the
machine is shared: absolute figures are noisy, ratios less so). The naive re-decode runs in the
current fp32 variant only (``--no-naive`` skips it). Also reports the largest difference between
the variants' one-pass waveforms (same seeded random weights). Prints a table and writes JSON to
``bench-results/``.

    python scripts/bench_codec.py [--full] [--frames 48] [--threads 2] [--baseline HEAD~1]
        [--dtypes fp32,bf16] [--reps 2] [--no-naive]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxcast.engine.precision import native_bfloat16
from voxcast.models.qwen3_tts.codec_decoder import SAMPLES_PER_FRAME, CodecDecoder, CodecDecoderConfig
from voxcast.testing.qwen3_tts_parts import speech_tokenizer_config

ROOT = Path(__file__).resolve().parents[1]
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
    return dec.to(dtype).eval().prepare()


def _stateful(dec: CodecDecoder, codes: torch.Tensor, chunk: int) -> tuple[float, float, np.ndarray]:
    """(wall s, process CPU s, waveform); CPU time is less sensitive to other load on a shared machine."""
    stream = dec.new_stream()
    out = []
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, codes.shape[0], chunk):
        out.append(stream.decode(codes[i : i + chunk]))
    return time.perf_counter() - t0, time.process_time() - c0, np.concatenate(out)


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


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One variant (the ``voxcast`` on ``PYTHONPATH``, one dtype): stateful and naive timings per chunk."""
    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtypes[0]]
    dec = _decoder(args.full, args.config, args.seed, dtype)
    codes = torch.randint(0, 2048, (args.frames, 16), generator=torch.Generator().manual_seed(args.seed))
    exact = dec.decode_offline(codes)
    np.save(args.wav_out, exact)
    _stateful(dec, codes[:8], 4)  # warm-up (and weight folding, where the variant folds)
    rows = []
    for chunk in args.chunks:
        t_s, cpu_s, wav_s = _stateful(dec, codes, chunk)
        row = {
            "chunk_frames": chunk,
            "stateful_ms_per_frame": 1000 * t_s / args.frames,
            "stateful_cpu_ms_per_frame": 1000 * cpu_s / args.frames,
            "stateful_max_err": float(np.abs(wav_s - exact).max()),
        }
        if not args.no_naive:
            t_n, wav_n = _naive(dec, codes, chunk, args.context)
            row |= {
                "naive_ms_per_frame": 1000 * t_n / args.frames,
                "naive_max_err": float(np.abs(wav_n - exact).max()),
            }
        rows.append(row)
    return {
        "params_m": sum(p.numel() for p in dec.parameters()) / 1e6,
        "loadavg_1m": os.getloadavg()[0],  # the machine may be shared: figures scale with load
        "rows": rows,
        "priming": _priming(dec, args.ref_frames),
    }


def _extract(rev: str, dest: Path) -> Path:
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tar.stdout, check=True)
    return dest / "src"


def _run_worker(args: argparse.Namespace, src: Path, dtype: str, naive: bool, wav: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--dtypes", dtype, "--wav-out", str(wav)]
    cmd += ["--frames", str(args.frames), "--chunks", ",".join(map(str, args.chunks))]
    cmd += ["--context", str(args.context), "--ref-frames", str(args.ref_frames)]
    cmd += ["--threads", str(args.threads), "--seed", str(args.seed), "--config", str(args.config)]
    cmd += ["--full"] * args.full + ["--no-naive"] * (not naive)
    res = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(src)), capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"worker failed:\n{res.stderr[-3000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over reps, per chunk size."""
    rows = []
    for i, r0 in enumerate(runs[0]["rows"]):
        row = {"chunk_frames": r0["chunk_frames"]}
        for key in r0:
            if key != "chunk_frames":
                row[key] = statistics.median(r["rows"][i][key] for r in runs)
        rows.append(row)
    prime = {k: statistics.median(r["priming"][k] for r in runs) for k in runs[0]["priming"]}
    return {"params_m": runs[0]["params_m"], "rows": rows, "priming": prime, "runs": runs}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every variant ``args.reps`` times, interleaved; returns the JSON-able result."""
    tmp = tempfile.TemporaryDirectory()
    variants = {f"current-{d}": (ROOT / "src", d) for d in args.dtypes}
    if args.baseline:
        variants = {
            f"baseline-{args.dtypes[0]}": (_extract(args.baseline, Path(tmp.name)), args.dtypes[0])
        } | variants
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    wavs: dict[str, np.ndarray] = {}
    for rep in range(args.reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for name in order:
            src, dtype = variants[name]
            naive = not args.no_naive and name == f"current-{args.dtypes[0]}"
            wav = Path(tmp.name) / f"{name}.npy"
            runs[name].append(_run_worker(args, src, dtype, naive, wav))
            wavs[name] = np.load(wav)
            ms = [f"{r['stateful_ms_per_frame']:.1f}" for r in runs[name][-1]["rows"]]
            print(f"rep {rep} {name:14s} ms/frame at chunks {args.chunks}: {ms}", file=sys.stderr, flush=True)
    first = next(iter(variants))
    result = {
        "size": "full" if args.full else "tiny",
        "frames": args.frames,
        "context_frames": args.context,
        "threads": args.threads,
        "baseline": args.baseline,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "variants": {k: _summary(v) for k, v in runs.items()},
        "max_abs_diff_vs_first": {k: float(np.abs(w - wavs[first]).max()) for k, w in wavs.items()},
        "first_variant": first,
    }
    tmp.cleanup()
    return result


def _print(res: dict[str, Any]) -> None:
    first = res["first_variant"]
    print(
        f"codec decoder ({res['size']}, {res['variants'][first]['params_m']:.1f}M params, "
        f"{res['threads']} threads, {res['frames']} frames; naive = {res['context_frames']} frames of left context)"
    )
    for name, v in res["variants"].items():
        print(f"{name}: one-pass waveform max |diff| vs {first}: {res['max_abs_diff_vs_first'][name]:.2e}")
        print(
            f"{'chunk':>7} {'ms/frame':>9} {'rtf':>6} {'vs ' + first:>22} {'cpu ms/fr':>10} {'cpu vs':>7} "
            f"{'stream err':>11} {'naive ms/fr':>12}"
        )
        for i, r in enumerate(v["rows"]):
            r0 = res["variants"][first]["rows"][i]
            ratio = r0["stateful_ms_per_frame"] / r["stateful_ms_per_frame"]
            cpu_ratio = r0["stateful_cpu_ms_per_frame"] / r["stateful_cpu_ms_per_frame"]
            naive = f"{r['naive_ms_per_frame']:12.1f}" if "naive_ms_per_frame" in r else f"{'-':>12}"
            print(
                f"{r['chunk_frames']:>7} {r['stateful_ms_per_frame']:>9.1f} {r['stateful_ms_per_frame'] / FRAME_MS:>6.2f} "
                f"{ratio:>21.2f}x {r['stateful_cpu_ms_per_frame']:>10.1f} {cpu_ratio:>6.2f}x "
                f"{r['stateful_max_err']:>11.1e} {naive}"
            )
        p = v["priming"]
        print(
            f"  priming {p['ref_frames']} reference frames: {p['prime_ms']:.1f} ms; clone: {p['clone_us']:.1f} us"
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
    ap.add_argument("--dtypes", type=lambda s: s.split(","), default=["fp32"], help="e.g. fp32,bf16")
    ap.add_argument("--emulated-bf16", action="store_true", help="run bf16 even where it is emulated")
    ap.add_argument("--baseline", default=None, help="git revision to compare against (e.g. HEAD~1)")
    ap.add_argument("--reps", type=int, default=1, help="runs of every variant (medians reported)")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive re-decode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--wav-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if "bf16" in args.dtypes and not native_bfloat16("cpu") and not args.emulated_bf16:
        print("no native bfloat16 on this CPU (emulated: 3-70x slower than fp32); skipping bf16")
        args.dtypes = [d for d in args.dtypes if d != "bf16"] or ["fp32"]
    res = run(args)
    _print(res)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"codec-{res['size']}.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
