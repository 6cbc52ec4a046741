"""Chatterbox Turbo's T3 with int8 weights against float32, same random weights, one run: ms per
decode token (one stream and two batched, alternated so drift cancels), the quantization's load
cost, and what int8 changes: the logits' error against float32's and how often the most likely
token agrees, step by step along the float model's own greedy tokens (teacher-forced, so one
disagreement does not derail the rest).

    python scripts/bench_turbo_quant.py [--size full] [--steps 64] [--out bench-results/turbo-quant.json]

A random checkpoint's logits are flatter than trained weights', so its top-1 agreement is a lower
bound on what a real checkpoint sees (a small change flips a near tie more often).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
from benchlib import machine_info, use_checkout, write_json  # noqa: E402

use_checkout()

from voxcast.models.chatterbox_turbo.gpt2 import KVCache  # noqa: E402
from voxcast.models.chatterbox_turbo.t3 import T3, load_t3  # noqa: E402
from voxcast.models.chatterbox_turbo.t3_quant import quantize_t3  # noqa: E402


def build(folder: Path, size: str) -> Path:
    from voxcast.testing.chatterbox_turbo import make_t3

    if not (folder / "t3_turbo_v1.safetensors").is_file():
        make_t3(folder, size=size, seed=0, stop_bias=-20.0)
    return folder


def prompt(t3: T3, positions: int, seed: int) -> torch.Tensor:
    """Input embeddings of a voice prefix and text (random tokens: ``positions`` of them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, t3.cfg.speech_vocab - 2, (1, positions), generator=g)
    return t3.speech_emb(ids)


@torch.inference_mode()
def decode_ms(t3: T3, rows: int, steps: int, positions: int) -> float:
    """ms per decode step of ``rows`` streams after a ``positions``-long prefill each."""
    caches = [KVCache() for _ in range(rows)]
    for i, c in enumerate(caches):
        t3.tfmr(prompt(t3, positions, i), c)
    x = torch.randn(rows, 1, t3.cfg.width)
    step = (lambda: t3.logits(t3.tfmr(x[:1], caches[0]))) if rows == 1 else (
        lambda: t3.logits(t3.tfmr.forward_rows(x, caches))
    )  # fmt: skip
    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1000


@torch.inference_mode()
def agreement(ref: T3, q: T3, steps: int, positions: int) -> dict[str, Any]:
    """Teacher-forced along ``ref``'s greedy tokens: per step, the logits' max error over their
    spread and whether both models' argmax agree."""
    caches = (KVCache(), KVCache())
    embeds = prompt(ref, positions, 7)
    h = [m.tfmr(embeds, c)[:, -1] for m, c in zip((ref, q), caches, strict=True)]
    errors, agree = [], []
    for _ in range(steps):
        la, lb = ref.logits(h[0])[0], q.logits(h[1])[0]
        errors.append(float((la - lb).abs().max() / la.std()))
        token = la.argmax()
        agree.append(bool(token == lb.argmax()))
        e = ref.speech_emb(token.view(1, 1))
        h = [m.tfmr(e, c)[:, -1] for m, c in zip((ref, q), caches, strict=True)]
    return {
        "steps": steps,
        "top1_agreement": sum(agree) / steps,
        "max_err_over_std_median": sorted(errors)[steps // 2],
        "max_err_over_std_max": max(errors),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--steps", type=int, default=64, help="decode steps timed per case, and compared")
    ap.add_argument("--positions", type=int, default=300, help="prefill length (voice prefix + text)")
    ap.add_argument("--reps", type=int, default=3, help="alternated repetitions per case")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "turbo-quant.json")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    folder = build(ROOT / ".cache" / "bench-models" / f"turbo-t3-{args.size}", args.size)
    ref = load_t3(folder)
    q = copy.deepcopy(ref)
    report = quantize_t3(q)
    fbgemm = copy.deepcopy(ref)
    quantize_t3(fbgemm, kernel=False)
    models = {"float32": ref, "int8": q, "int8_fbgemm": fbgemm}
    times: dict[str, dict[int, list[float]]] = {k: {1: [], 2: []} for k in models}
    for _ in range(args.reps):
        for rows in (1, 2):
            for name, m in models.items():
                times[name][rows].append(decode_ms(m, rows, args.steps, args.positions))
    med = {k: {r: sorted(v)[len(v) // 2] for r, v in d.items()} for k, d in times.items()}
    doc = {
        "machine": machine_info(),
        "config": {k: str(v) for k, v in vars(args).items()},
        "quantize": report,
        "decode_ms": {k: {str(r): v for r, v in d.items()} for k, d in med.items()},
        "speedup_one_stream": med["float32"][1] / med["int8"][1],
        "speedup_two_streams": med["float32"][2] / med["int8"][2],
        "agreement": agreement(ref, q, args.steps, args.positions),
    }
    for name in models:
        print(f"{name:12s} one stream {med[name][1]:6.1f} ms/token, two batched {med[name][2]:6.1f} ms/step")
    a = doc["agreement"]
    print(
        f"int8 / float32 time: {1 / doc['speedup_one_stream']:.2f}x one stream, {1 / doc['speedup_two_streams']:.2f}x two; "
        f"quantized in {report['seconds']} s (kernel {report['kernel']}); top-1 agreement {a['top1_agreement']:.2%}, "
        f"logit error / spread median {a['max_err_over_std_median']:.3f}"
    )
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
