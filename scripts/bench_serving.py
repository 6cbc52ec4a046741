"""Serving benchmark: the real Engine under 1..N concurrent streams, decode thread on vs off.

On a random-weight Base checkpoint (``--size``; built once and cached, see bench_engine.py; or any
Base checkpoint directory, ``--model``) with an
ICL voice cloned from a synthetic reference, for each decode-thread setting (two engines sharing one
loaded model; every measurement runs in both settings back to back, order alternating per rep) it
measures:
  TTFA of a new reference (the request carries reference audio never seen before: the voice is built
  inside the request), of a known voice's first request (voice prompt built, its audio decoder primed
  and its prompt prefix computed, as ``Engine.create_voice`` leaves it) and of a cached voice's next
  request (the engine's per-voice prefix cache too), with each
  request's ``timing.extra``;
  for N in ``--streams`` concurrent streams started together: aggregate frames/s and audio seconds
  per wall second, per-stream time per frame (wall, and generation only), TTFA, playback stalls, RTF.
Prints a table and the on/off ratios (medians of back-to-back pairs); writes bench-results/serving-<size>.json and .png.
``--official`` also times the official qwen-tts (one stream at a time; it has no streaming or
batching) on the same weights, via bench_engine.run_official.

    python scripts/bench_serving.py [--size tiny | --model DIR] [--streams 1,2,4,8] [--frames 24] [--reps 2]
        [--decode-thread both|on|off|auto] [--official]

``--priming-ab N`` also times a new voice's first request N times in each of three preparations,
alternated: nothing ahead, its audio decoder primed ahead, and the decoder primed and its prompt prefix
computed ahead (as ``Engine.create_voice`` leaves a voice).

``--decode-thread auto`` runs one engine that picks the mode at warm-up; the JSON records its timings
(``decode_calibration``).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import soundfile as sf
import torch

ROOT = Path(__file__).resolve().parents[1]
from benchlib import checkpoint, machine_info, use_checkout  # noqa: E402

use_checkout()


from bench_engine import REF_TEXT, TEXT, run_official  # noqa: E402

from voxcast.audio.reference import synthetic_reference_audio  # noqa: E402
from voxcast.config import EngineConfig  # noqa: E402
from voxcast.engine.engine import Engine  # noqa: E402
from voxcast.engine.runtime_info import runtime_choices  # noqa: E402
from voxcast.engine.threads import on_fresh_thread  # noqa: E402

SR = 24000
MODES = {"on": "on", "off": "off", "auto": "auto"}


def reference_audio(k: int) -> Any:
    """Synthetic reference ``k``: ~3 s, a different length (so a different voice) for every ``k``."""
    return synthetic_reference_audio(SR, seconds=3.0 + 0.01 * k)


def fresh_voice(engine: Engine, k: int, primed: bool = True) -> tuple[Any, Any]:
    """An ICL voice no cache has seen (its reference audio differs for every ``k``)."""
    ref = reference_audio(k)
    # off this thread and primed, as Engine.create_voice does (voxcast.engine.threads)
    voice = on_fresh_thread(lambda: engine.model.make_voice_prompt(ref, SR, ref_text=REF_TEXT))
    return engine.prime_voice(voice) if primed else voice, ref


def reference_wav(k: int) -> str:
    """Reference ``k`` of :func:`fresh_voice` as a base64 WAV, the way a request carries it."""
    buf = io.BytesIO()
    sf.write(buf, reference_audio(k), SR, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


def stream_record(
    engine: Engine, voice: Any, frames: int, seed: int, ref_audio: str | None = None
) -> dict[str, Any]:
    """Run one request to the end; its timing and chunk emit times (s since the request started).

    With ``ref_audio`` (and ``voice`` None) the engine builds the voice inside the request, and the
    built voice is returned under ``"voice"``.
    """
    req: dict[str, Any] = {"text": TEXT, "max_frames": frames, "seed": seed}
    if ref_audio is not None:
        req |= {"ref_audio": ref_audio, "ref_text": REF_TEXT}
    stream = engine.synthesize(req, voice)
    emits = [c.t_emit - stream.started_at for c in stream]
    t = stream.timing
    extra = {k: v for k, v in t.extra.items() if k != "codes"}
    return {
        "frames": t.frames,
        "ttfa_ms": t.ttfa_ms,
        "prefill_ms": t.prefill_ms,
        "total_ms": t.total_ms,
        "ms_per_frame": t.total_ms / max(1, t.frames),
        "gen_ms_per_frame": t.frame_ms,
        "codec_ms_per_frame": t.codec_ms / max(1, t.frames),
        "audio_s": t.audio_s,
        "rtf": t.rtf,
        "stalls": t.stalls,
        "stall_ms": t.stall_ms,
        "emits_s": emits,
        "extra": extra,
        "timing": {k: v for k, v in t.to_dict().items() if k != "extra"},
        "voice": stream.voice,
    }


#: TTFA probes, in the order they run (see the module docstring).
TTFA_KINDS = ("new_reference", "known_voice", "cached")


def ttfa_probe(engine: Engine, k: int, frames: int) -> tuple[dict[str, Any], Any]:
    """A new reference (voice built in the request), a known voice's first request, and its next one.

    Returns:
        the three records, and the known voice (reused for the concurrency levels).
    """
    new = stream_record(engine, None, frames, seed=0, ref_audio=reference_wav(k))
    voice, _ = fresh_voice(engine, k + 1)
    first = stream_record(engine, voice, frames, seed=0)
    second = stream_record(engine, voice, frames, seed=1)
    return {"new_reference": new, "known_voice": first, "cached": second}, voice


def priming_ab(engine: Engine, pairs: int, frames: int, k0: int = 20) -> dict[str, Any]:
    """First-request TTFA of a fresh voice prepared three ways, in one engine, ``pairs`` of each, in the
    order lazy, codec, full, full, codec, lazy, ...: ``lazy`` nothing ahead (the first request primes
    the audio decoder and computes the prompt prefix, as the engine once did), ``codec`` the audio decoder
    primed ahead (``Engine.prime_voice(prefix=False)``), ``full`` the decoder primed and
    the prompt prefix computed ahead (``Engine.prime_voice``, as ``create_voice`` does now)."""
    arms = ["lazy", "codec", "full"]
    ttfa: dict[str, list[float]] = {arm: [] for arm in arms}
    prep_ms: dict[str, list[float]] = {"codec": [], "full": []}
    k = k0
    for rep in range(pairs):
        for arm in arms if rep % 2 == 0 else arms[::-1]:
            voice, _ = fresh_voice(engine, k, primed=False)
            k += 1
            if arm != "lazy":
                t0 = time.perf_counter()
                engine.prime_voice(voice, prefix=arm == "full")
                prep_ms[arm].append((time.perf_counter() - t0) * 1000)
            ttfa[arm].append(stream_record(engine, voice, frames, seed=0)["ttfa_ms"])
    med = {arm: statistics.median(v) for arm, v in ttfa.items()}
    return {
        "ttfa_ms": ttfa,
        "median_ttfa_ms": med,
        "codec_over_lazy": med["codec"] / med["lazy"],
        "full_over_lazy": med["full"] / med["lazy"],
        "full_over_codec": med["full"] / med["codec"],
        "prepare_ms_median": {arm: statistics.median(v) for arm, v in prep_ms.items()},
    }


def concurrent(engine: Engine, voice: Any, n: int, frames: int) -> dict[str, Any]:
    """N streams started together; aggregate and per-stream figures."""
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    start = threading.Barrier(n + 1)

    def one(i: int) -> None:
        start.wait()
        rows[i] = stream_record(engine, voice, frames, seed=100 + i)
        del rows[i]["voice"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    total_frames = sum(r["frames"] for r in rows)
    return {
        "streams": n,
        "wall_s": wall,
        "frames_per_s": total_frames / wall,
        "audio_s_per_wall_s": sum(r["audio_s"] for r in rows) / wall,
        "ms_per_frame": statistics.median(r["ms_per_frame"] for r in rows),
        "gen_ms_per_frame": statistics.median(r["gen_ms_per_frame"] for r in rows),
        "ttfa_ms": statistics.median(r["ttfa_ms"] for r in rows),
        "stalls": sum(r["stalls"] for r in rows),
        "stall_ms_per_stream": sum(r["stall_ms"] for r in rows) / n,
        "rtf": statistics.median(r["rtf"] for r in rows),
        "per_stream": rows,
    }


def official_runs(path: Path, ref: Any, frames: int, reps: int, dtype: torch.dtype) -> dict[str, Any]:
    """The official qwen-tts: one voice-clone generation per rep on the same weights."""
    from tests.parity._official import load_official, official_voice_items

    wrapper = load_official(path, dtype=dtype)
    items = official_voice_items(wrapper, ref, SR, REF_TEXT, False)
    runs = [run_official(wrapper, items, frames, seed=i) for i in range(reps)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    med["frames_per_s"] = med["frames"] / (med["total_ms"] / 1000)
    return {"median": med, "runs": runs}


def median_of(reps: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in reps))


def summarize(runs: dict[str, dict[str, Any]], levels: list[int]) -> dict[str, Any]:
    """Medians over reps per mode and level; on/off ratios."""
    out: dict[str, Any] = {}
    for mode, r in runs.items():
        ttfa = {
            kind: {
                "ttfa_ms": statistics.median(p[kind]["ttfa_ms"] for p in r["ttfa"]),
                "prefill_ms": statistics.median(p[kind]["prefill_ms"] for p in r["ttfa"]),
                "voice_ms": statistics.median(p[kind]["timing"].get("voice_ms") or 0.0 for p in r["ttfa"]),
                "ttfa_runs_ms": [p[kind]["ttfa_ms"] for p in r["ttfa"]],
                "extra": r["ttfa"][-1][kind]["extra"],
                "timing": r["ttfa"][-1][kind]["timing"],
            }
            for kind in TTFA_KINDS
        }
        keys: tuple[str, ...] = ("frames_per_s", "audio_s_per_wall_s", "ms_per_frame", "gen_ms_per_frame")
        keys += ("ttfa_ms", "stalls", "stall_ms_per_stream", "rtf")
        per_level = {n: {k: median_of(r["levels"][n], k) for k in keys} for n in levels}
        if 1 in levels:  # the batching target: N streams make >= 0.9 x N x one stream's frames/s
            one = per_level[1]["frames_per_s"]
            for n in levels:
                per_level[n]["batching_ratio"] = per_level[n]["frames_per_s"] / (n * one) if one else 0.0
        out[mode] = {"ttfa": ttfa, "levels": per_level}
    if {"on", "off"} <= out.keys():
        out["on_over_off"] = {
            n: paired_ratios(runs["on"]["levels"][n], runs["off"]["levels"][n]) for n in levels
        }
    return out


def paired_ratios(on: list[dict[str, Any]], off: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over reps of on/off ratios of back-to-back runs (robust to a drifting machine load)."""
    out: dict[str, Any] = {}
    for k in ("frames_per_s", "ms_per_frame", "ttfa_ms"):
        ratios = [a[k] / b[k] for a, b in zip(on, off, strict=True) if b[k]]
        out[k] = statistics.median(ratios)
        out[f"{k}_range"] = [min(ratios), max(ratios)]
    return out


def plot(summary: dict[str, Any], levels: list[int], official: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in MODES if m in summary]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for mode in modes:
        lv = summary[mode]["levels"]
        label = f"decode thread {mode}"
        axes[0].plot(levels, [lv[n]["frames_per_s"] for n in levels], "o-", label=label)
        axes[1].plot(levels, [lv[n]["ms_per_frame"] for n in levels], "o-", label=label)
    if official is not None:
        axes[0].axhline(official["median"]["frames_per_s"], ls="--", c="grey", label="official qwen-tts")
        axes[1].axhline(official["median"]["frame_ms"], ls="--", c="grey", label="official (codes only)")
    axes[1].axhline(80, ls=":", c="red", label="real time (80 ms)")
    axes[0].set(xlabel="concurrent streams", ylabel="aggregate frames/s", title="throughput")
    axes[1].set(xlabel="concurrent streams", ylabel="ms per frame per stream (wall)", title="per stream")
    kinds = TTFA_KINDS
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        ttfa = [summary[mode]["ttfa"][k]["ttfa_ms"] for k in kinds]
        axes[2].bar([x + i * width for x in range(len(kinds))], ttfa, width, label=f"decode thread {mode}")
    axes[2].set_xticks(
        [x + width * (len(modes) - 1) / 2 for x in range(len(kinds))], [k.replace("_", " ") for k in kinds]
    )
    axes[2].set(ylabel="time to first audio (ms)", title="TTFA, one stream")
    for ax in axes[:2]:
        ax.set_xticks(levels)
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_engines(path: Path, modes: list[str], dtype: str, **options: Any) -> dict[str, Engine]:
    """One loaded model, one warmed engine per decode-thread setting (``options``: more EngineConfig fields)."""
    first = Engine.load(EngineConfig(model=str(path), dtype=dtype, decode_thread=MODES[modes[0]], **options))
    engines = {modes[0]: first}
    for mode in modes[1:]:
        config = EngineConfig(model=str(path), dtype=dtype, decode_thread=MODES[mode], **options)
        engines[mode] = Engine(first.model, config, load_ms=first.load_ms)
        engines[mode].warmup()
    return engines


def print_table(summary: dict[str, Any], levels: list[int], official: dict[str, Any] | None) -> None:
    for mode in (m for m in MODES if m in summary):
        s = summary[mode]
        t = s["ttfa"]
        new, known, cached = (t[k] for k in TTFA_KINDS)
        print(
            f"\ndecode thread {mode}: TTFA new reference {new['ttfa_ms']:.0f} ms (voice built in "
            f"{new['voice_ms']:.0f} ms; runs {', '.join(f'{x:.0f}' for x in new['ttfa_runs_ms'])}), known voice {known['ttfa_ms']:.0f} ms, cached "
            f"{cached['ttfa_ms']:.0f} ms ({cached['ttfa_ms'] / new['ttfa_ms']:.2f}x new reference, "
            f"{cached['ttfa_ms'] / known['ttfa_ms']:.2f}x known voice); prefill "
            f"{new['prefill_ms']:.0f} / {known['prefill_ms']:.0f} / {cached['prefill_ms']:.0f} ms; "
            f"cached request: prefix_cache_hit {cached['timing'].get('prefix_cache_hit', 'n/a')}"
        )
        print(
            "streams  frames/s  audio-s/s  ms/frame  gen ms/frame  TTFA ms  stalls  stall ms  RTF  batching"
        )
        for n in levels:
            v = s["levels"][n]
            print(
                f"{n:7d}  {v['frames_per_s']:8.2f}  {v['audio_s_per_wall_s']:9.3f}  {v['ms_per_frame']:8.1f}  "
                f"{v['gen_ms_per_frame']:12.1f}  {v['ttfa_ms']:7.0f}  {v['stalls']:6.0f}  "
                f"{v['stall_ms_per_stream']:8.0f}  {v['rtf']:5.2f}  {v.get('batching_ratio', float('nan')):8.2f}"
            )
    if "on_over_off" in summary:
        print("\non/off ratios, medians of back-to-back pairs (range):")
        for n, r in summary["on_over_off"].items():
            print(
                f"  {n} streams: "
                + ", ".join(
                    f"{k} x{v:.2f} ({r[k + '_range'][0]:.2f}-{r[k + '_range'][1]:.2f})"
                    for k, v in r.items()
                    if not k.endswith("_range")
                )
            )
    if official is not None:
        o = official["median"]
        print(
            f"\nofficial qwen-tts, one stream: {o['frames_per_s']:.2f} frames/s, "
            f"{o['frame_ms']:.0f} ms/frame (codes only), first audio = total {o['total_ms']:.0f} ms"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--model", type=Path, help="a Base checkpoint directory instead of --size")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--decode-thread", default="both", choices=["both", "on", "off", "auto"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--quant", default="none", choices=["none", "int8"], help="VOXCAST_QUANT")
    ap.add_argument("--codec-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (VOXCAST_DEVICE)")
    ap.add_argument("--compile", default="off", choices=["off", "on", "auto"], help="VOXCAST_COMPILE")
    ap.add_argument(
        "--batch-graphs",
        default="off",
        choices=["off", "on"],
        help="VOXCAST_BATCH_GRAPHS: frames of a batch in cache slots, a CUDA graph per batch bucket on CUDA",
    )
    ap.add_argument("--official", action="store_true", help="also time the official qwen-tts")
    ap.add_argument(
        "--priming-ab",
        type=int,
        default=0,
        metavar="N",
        help="also time a new voice's first request N times each: nothing / decoder / decoder + prefix ahead",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    modes = ["on", "off"] if args.decode_thread == "both" else [args.decode_thread]

    path = args.model or checkpoint(args.size)
    name = args.model.name if args.model else args.size
    engines = load_engines(
        path, modes, args.dtype, device=args.device, compile=args.compile, quant=args.quant,
        codec_dtype=args.codec_dtype, settings={"batch_graphs": args.batch_graphs},
    )  # fmt: skip
    for mode, engine in engines.items():
        if engine.precision is not None and engine.precision.fallbacks:
            print(f"decode thread {mode}: no native bfloat16 here, running {engine.precision.as_dict()}")
        if engine.decode_calibration:
            cal = engine.decode_calibration
            print(
                f"decode thread {mode}: warm-up chose {'on' if cal['decode_thread'] else 'off'} "
                f"(calibration streams {cal['on_ms']:.0f} ms with the thread, {cal['off_ms']:.0f} ms without)"
            )
    model = engines[modes[0]].model
    runs: dict[str, dict[str, Any]] = {m: {"ttfa": [], "levels": {n: [] for n in levels}} for m in modes}
    k, ref = 0, None
    for rep in range(args.reps):  # interleaved: each measurement in both modes back to back
        order = modes if rep % 2 == 0 else modes[::-1]
        voices = {}
        for mode in order:
            probe, voices[mode] = ttfa_probe(engines[mode], k, args.frames)
            ref = reference_audio(k + 1)  # the known voice's reference, for --official
            k += 2
            for rec in probe.values():
                del rec["voice"]
            runs[mode]["ttfa"].append(probe)
        for n in levels:
            for mode in order:
                level = concurrent(engines[mode], voices[mode], n, args.frames)
                runs[mode]["levels"][n].append(level)
                print(
                    f"rep {rep} decode thread {mode:3s} {n} stream(s): {level['frames_per_s']:.2f} frames/s, "
                    f"{level['ms_per_frame']:.0f} ms/frame, TTFA {level['ttfa_ms']:.0f} ms",
                    flush=True,
                )
    priming = priming_ab(engines[modes[0]], args.priming_ab, args.frames) if args.priming_ab else None
    for engine in engines.values():
        engine.close()

    official = None
    if args.official:
        dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
        official = official_runs(path, ref, args.frames, args.reps, dtype)

    summary = summarize(runs, levels)
    doc = {
        "machine": machine_info(),
        "config": vars(args) | {"out": str(args.out), "checkpoint": str(path)},
        "load_ms": engines[modes[0]].load_ms,
        "warmup_ms": {m: e.warmup_ms for m, e in engines.items()},
        "decode_calibration": {m: e.decode_calibration for m, e in engines.items()},
        "runtime": {m: runtime_choices(e) for m, e in engines.items()},
        "model": {"identity": model.identity, "prefix_cache": getattr(model, "prefix_cache_enabled", None)},
        "summary": summary,
        "official": official,
        "priming_ab": priming,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if args.device != "cpu":
        name += f"-{args.device.replace(':', '')}-{args.dtype}" + (
            "-compiled" if args.compile != "off" else ""
        )
    if args.batch_graphs == "on":
        name += "-batch-graphs"
    out = args.out / f"serving-{name}.json"
    out.write_text(json.dumps(doc, indent=1, default=str))
    plot(summary, levels, official, out.with_suffix(".png"))
    print_table(summary, levels, official)
    if priming is not None:
        m, prep = priming["median_ttfa_ms"], priming["prepare_ms_median"]
        print(
            f"\nfirst request of a new voice ({args.priming_ab} of each, alternated): TTFA nothing ahead "
            f"{m['lazy']:.0f} ms, decoder primed ahead {m['codec']:.0f} ms (x{priming['codec_over_lazy']:.2f}; "
            f"{prep['codec']:.0f} ms ahead), decoder + prompt prefix ahead {m['full']:.0f} ms "
            f"(x{priming['full_over_lazy']:.2f}, x{priming['full_over_codec']:.2f} of decoder only; "
            f"{prep['full']:.0f} ms ahead)"
        )
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
