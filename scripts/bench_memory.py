"""Memory benchmark: resident memory of a loaded, warmed engine and what each concurrent stream adds.

For each configuration (``--configs``: ``fp32`` = float32 weights and codec, ``int8`` = int8
talker/code-predictor weights and a bfloat16 codec, ``fp32-rows-off`` = fp32 without voxcast's
float32 row kernels and their packed weights) a child process (so every figure starts from a
clean process) loads the random full-size checkpoint (``--size``; see bench_engine.py), and records
resident memory (RSS, from /proc) after importing torch, after loading, and after warm-up (the
engine then returns freed heap memory to the OS: ``heap_trim`` has RSS before and after), plus the
bytes of each component's weights. Then, for N in ``--streams``, it starts N concurrent streams of
a long text (the frame limit derived from the text, as a request without ``max_frames`` gets), lets
each produce ``--frames`` frames, samples RSS while they run, and cancels them: the peak minus the
idle RSS, divided by N, is the memory one stream adds.

``--kv whole`` repeats every configuration with the talker's key/value cache allocated for the
whole frame limit up front (as before it grew on demand), and ``--embeddings wide`` with the
embedding tables widened to float32 at load (as before bfloat16-stored tables stayed narrow), so the
JSON and plot show both sides of each change.

Writes bench-results/memory-<size>.json and .png.

    python scripts/bench_memory.py [--size 0.6b] [--configs fp32,int8] [--streams 1,4,8] [--frames 24]
        [--kv grow,whole] [--embeddings narrow,wide]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
from benchlib import use_checkout  # noqa: E402

use_checkout()


from voxcast import memory  # noqa: E402  (no torch: "start" is measured before it)

#: About 600 characters: the derived frame limit is ~1290 frames (103 s of audio).
LONG_TEXT = " ".join(
    [
        "Thank you for calling the customer service line of the city water department.",
        "If you are reporting a leak or a loss of water pressure, please stay on the line.",
        "To pay a bill, check a balance, or set up automatic payments, press one at any time.",
        "To start, stop, or transfer service to a new address, press two.",
        "For questions about water quality, conservation programs, or rebates, press three.",
        "For all other questions, please hold and the next available representative will help you.",
        "Calls may be recorded for quality assurance. Thank you for your patience.",
    ]
)

CONFIGS: dict[str, dict[str, Any]] = {
    "fp32": {"dtype": "float32", "quant": "none", "codec_dtype": "float32"},
    "int8": {"dtype": "float32", "quant": "int8", "codec_dtype": "bfloat16"},
    # float32 on PyTorch's kernels only (no packed copies for voxcast's float32 row kernels)
    "fp32-rows-off": {
        "dtype": "float32",
        "quant": "none",
        "codec_dtype": "float32",
        "settings": {"f32_rows": "off"},
    },
}


def rss_mb() -> float:
    """This process's resident memory now (MB); the benchmark needs Linux's /proc."""
    mb = memory.rss_mb()
    if mb is None:
        raise SystemExit("bench_memory needs /proc/self/statm (Linux)")
    return mb


class Sampler:
    """Peak RSS over a stretch of time, sampled every few milliseconds on its own thread."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            time.sleep(period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def weight_mb(module: Any) -> float:
    """Bytes (MB) of a module's tensors, int8-packed Linears included (their state_dict holds them)."""
    import torch

    total = 0
    for value in module.state_dict().values():
        tensors = value if isinstance(value, tuple) else (value,)
        for t in tensors:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total / 1e6


def components(engine: Any) -> dict[str, float]:
    model = engine.model
    talker = model.net.talker
    out = {
        "talker (without code predictor)": weight_mb(talker) - weight_mb(talker.code_predictor),
        "code predictor": weight_mb(talker.code_predictor),
        "codec decoder": weight_mb(model.codec_decoder),
    }
    if model.codec_encoder is not None:
        out["codec encoder"] = weight_mb(model.codec_encoder.mimi)
    if model.net.speaker_encoder is not None:
        out["speaker encoder"] = weight_mb(model.net.speaker_encoder)
    return out


def run_streams(engine: Any, n: int, frames: int) -> dict[str, Any]:
    """N concurrent long streams until each has ``frames`` frames; RSS peak over the idle level."""
    memory.trim_heap()  # idle level without what earlier streams freed but the allocator kept
    idle = rss_mb()
    streams = [engine.synthesize({"text": LONG_TEXT, "seed": i, "voice": "ryan"}) for i in range(n)]
    limits: list[int] = []  # frames each stream produced before it was cancelled
    with Sampler() as sampler:
        start = threading.Barrier(n + 1)

        def consume(s: Any) -> None:
            start.wait()
            got = 0
            for chunk in s:
                got += chunk.frames
                if got >= frames:
                    s.cancel()

        threads = [threading.Thread(target=consume, args=(s,)) for s in streams]
        for t in threads:
            t.start()
        start.wait()
        for t in threads:
            t.join()
    for s in streams:
        limits.append(int(s.timing.frames))
    memory.trim_heap()
    return {
        "streams": n,
        "idle_rss_mb": idle,
        "peak_rss_mb": sampler.peak,
        "per_stream_mb": (sampler.peak - idle) / n,
        "after_rss_mb": rss_mb(),
        "frames_per_stream": limits,
    }


def child(config: str, kv: str, emb: str, size: str, levels: list[int], frames: int) -> dict[str, Any]:
    """One configuration in this (fresh) process."""
    t0 = rss_mb()
    import torch
    from benchlib import checkpoint

    from voxcast.config import EngineConfig, max_frames_for_text
    from voxcast.engine.engine import Engine
    from voxcast.models.qwen3_tts import generator

    if kv == "whole":
        generator.KV_RESERVE_FRAMES = 1 << 20  # room for the whole limit at once
    if emb == "wide":  # embedding tables widened to float32 at load (as before they stayed narrow)
        import functools

        from voxcast.models.qwen3_tts import checkpoint as ckpt
        from voxcast.models.qwen3_tts import model as model_module

        model_module.load_network = functools.partial(ckpt.load_network, narrow_embeddings=False)
    path = checkpoint(size, "custom_voice")
    rss = {"start": t0, "torch imported": rss_mb()}
    cfg = CONFIGS[config]
    engine = Engine.load(
        EngineConfig(model=str(path), device="cpu", warmup=False, decode_thread="off", **cfg)
    )
    rss["loaded"] = rss_mb()
    engine.warmup()
    rss["warmed up"] = rss_mb()
    out = {
        "config": config,
        "kv": kv,
        "embeddings": emb,
        "settings": cfg,
        "threads": torch.get_num_threads(),
        "frame_limit": max_frames_for_text(LONG_TEXT),
        "rss_mb": rss,
        "heap_trim": engine.heap_trim,
        "weights_mb": components(engine),
        "levels": [run_streams(engine, n, frames) for n in levels],
    }
    engine.close()
    return out


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    labels = [f"{r['config']}\nKV {r['kv']}, emb {r['embeddings']}" for r in results]
    phases = list(results[0]["rss_mb"])
    for i, phase in enumerate(phases):
        axes[0].bar(
            [x + i * 0.8 / len(phases) for x in range(len(results))],
            [r["rss_mb"][phase] for r in results],
            0.8 / len(phases),
            label=phase,
        )
    axes[0].set_xticks([x + 0.4 - 0.4 / len(phases) for x in range(len(results))], labels, fontsize=8)
    axes[0].set(ylabel="resident memory (MB)", title="engine RSS")
    for r, label in zip(results, labels, strict=True):
        lv = r["levels"]
        axes[1].plot(
            [x["streams"] for x in lv], [x["peak_rss_mb"] for x in lv], "o-", label=label.replace("\n", ", ")
        )
    axes[1].set(xlabel="concurrent streams", ylabel="peak RSS while streaming (MB)", title="streams")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--configs", default="fp32,int8")
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--kv", default="grow,whole")
    ap.add_argument("--embeddings", default="narrow", help="narrow, wide or both (narrow,wide)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    if args.child:
        config, kv, emb = args.child.split(":")
        print(json.dumps(child(config, kv, emb, args.size, levels, args.frames)))
        return 0
    results = []
    variants = [
        (config, kv, emb)
        for config in args.configs.split(",")
        for kv in args.kv.split(",")
        for emb in args.embeddings.split(",")
    ]
    for config, kv, emb in variants:
        cmd = [sys.executable, __file__, "--child", f"{config}:{kv}:{emb}", "--size", args.size]
        cmd += ["--streams", args.streams, "--frames", str(args.frames)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        rss = r["rss_mb"]
        w = r["weights_mb"]
        print(
            f"{config} (KV {kv}, embeddings {emb}): RSS torch {rss['torch imported']:.0f} MB, loaded {rss['loaded']:.0f}, "
            f"warmed {rss['warmed up']:.0f}; weights "
            + ", ".join(f"{k} {v:.0f}" for k, v in w.items())
            + f" MB (total {sum(w.values()):.0f})",
            flush=True,
        )
        if r["heap_trim"]:
            h = r["heap_trim"]
            print(
                f"  engine returned free heap after warm-up: RSS {h['rss_before_mb']:.0f} -> "
                f"{h['rss_after_mb']:.0f} MB ({h['rss_after_mb'] / h['rss_before_mb']:.2f}x)",
                flush=True,
            )
        for lv in r["levels"]:
            print(
                f"  {lv['streams']} stream(s), limit {r['frame_limit']} frames: peak {lv['peak_rss_mb']:.0f} MB, "
                f"{lv['per_stream_mb']:.1f} MB per stream above idle {lv['idle_rss_mb']:.0f} MB",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"memory-{args.size}.json"
    out.write_text(json.dumps({"text_chars": len(LONG_TEXT), "results": results}, indent=2))
    png = out.with_suffix(".png")
    plot(results, png)
    print(f"wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
