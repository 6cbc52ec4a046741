"""Profile Chatterbox Turbo's streamed S3Gen + HiFT path: one utterance's speech
tokens pushed 4 at a time through the engine's decoder (:class:`TurboDecoder`), as the engine does,
on a random full-size checkpoint; each push timed (device synchronised), then the same run under
``torch.profiler``: the operators by self host time and by device time, the host-device syncs
(``aten::item``, ``_local_scalar_dense``, copies to the host), kernel launches and allocations, per
chunk (a push that returned audio) and per push. The script's own ``torch.cuda.synchronize`` after
every push shows as one ``cudaDeviceSynchronize`` per push.

    python scripts/profile_turbo_stream.py --device cuda --dtype bfloat16 [--seconds 10] [--out DIR]
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
from voxcast.testing.signals import speech_like  # noqa: E402

#: Operators that make the host wait for the device (or copy to the host).
SYNCS = (
    "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal",
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "aten::nonzero",
)  # fmt: skip
#: The CUDA runtime's kernel launch calls.
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cuLaunchKernel")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(model: ChatterboxTurbo, voice: Any, tokens: list[int], device: torch.device) -> list[float]:
    """Push ``tokens`` 4 at a time, then finish; the wall ms of each call that returned audio."""
    decoder = model.new_decoder(voice, seed=7)
    costs = []
    for i in range(0, len(tokens), 4):
        t0 = time.perf_counter()
        out = decoder.decode(torch.tensor(tokens[i : i + 4])[:, None])
        sync(device)
        if len(out):
            costs.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    decoder.finish()
    sync(device)
    costs.append((time.perf_counter() - t0) * 1000)
    return costs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--prompt-cache", type=int, default=1, choices=[0, 1])
    ap.add_argument("--rows", type=int, default=30, help="operators per table")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()
    from bench_chatterbox_turbo import build

    torch.set_flush_denormal(True)
    folder = build(ROOT / ".cache" / "bench-models" / f"turbo-{args.size}-nostop", args.size)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    opts = LoadOptions(
        device=args.device,
        dtype=dtype,
        codec_dtype=dtype,
        settings=(("turbo_prompt_cache", args.prompt_cache),),
    )
    model = ChatterboxTurbo.from_pretrained(folder, opts)
    device = model.device
    voice = model.make_voice(speech_like(10.0, 24000, seed=9), 24000, None, False)
    model.prime_voice(voice)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 6561, (int(args.seconds * 25),), generator=g).tolist()

    run(model, voice, tokens, device)  # warm: kernels chosen, allocator filled
    costs = run(model, voice, tokens, device)
    print("push ms (returned audio):", " ".join(f"{c:.0f}" for c in costs), flush=True)
    print(
        f"total {sum(costs):.0f} ms for {args.seconds:.1f} s of audio: RTF {sum(costs) / 1000 / args.seconds:.3f}"
    )

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        prof_costs = run(model, voice, tokens, device)
    events = prof.key_averages()
    host = events.table(sort_by="self_cpu_time_total", row_limit=args.rows)
    print("\n== by self host time ==\n" + host)
    dev_table = ""
    if device.type == "cuda":
        try:
            dev_table = events.table(sort_by="self_device_time_total", row_limit=args.rows)
        except (AttributeError, KeyError, ValueError):
            dev_table = events.table(sort_by="self_cuda_time_total", row_limit=args.rows)
        print("\n== by device time ==\n" + dev_table)
    counts = {
        e.key: e.count for e in events if e.key in SYNCS or "Memcpy" in e.key or "malloc" in e.key.lower()
    }
    pushes = len(prof_costs)
    all_pushes = -(-len(tokens) // 4) + 1  # every decode() call and finish()
    launches = sum(e.count for e in events if e.key in LAUNCHES)
    ops = sum(e.count for e in events if e.key.startswith("aten::"))
    print("\n== syncs, copies and allocations (count, per chunk = push that returned audio, per push) ==")
    for key, n in sorted(counts.items()):
        print(f"{key:40s} {n:7d} {n / pushes:8.1f} {n / all_pushes:8.2f}")
    print(f"{'aten:: operators (nested included)':40s} {ops:7d} {ops / pushes:8.1f} {ops / all_pushes:8.2f}")
    if device.type == "cuda":
        print(f"{'kernel launches':40s} {launches:7d} {launches / pushes:8.1f} {launches / all_pushes:8.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"profile-turbo-stream-{device.type}"
    (args.out / f"{name}.txt").write_text(host + "\n\n" + dev_table)
    doc = {
        "machine": machine_info(),
        "config": {k: str(v) for k, v in vars(args).items()},
        "push_ms": [round(c, 1) for c in costs],
        "total_ms": round(sum(costs), 1),
        "rtf": sum(costs) / 1000 / args.seconds,
        "profiled_push_ms": [round(c, 1) for c in prof_costs],
        "sync_counts": counts,
        "chunks": pushes,
        "pushes": all_pushes,
        "aten_ops": ops,
        "kernel_launches": launches,
    }
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out / name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
