"""S3Gen + HiFT streaming strategies for Chatterbox Turbo on a random checkpoint, one run:
the same speech tokens (random ids, the 3 silence tokens upstream appends at the end) in the
same voice, decoded

(a) in independent chunks: each chunk's tokens through the flow alone (after the voice prompt) and
    its mel through HiFT alone (the founding experiment), noise pinned as (c)'s;
(b) by re-decoding everything so far at every flush (flow and HiFT over all tokens, fresh noise each
    time, the prompt's included) and joining the new audio with a 12 ms crossfade (upstream PR #528);
(c) by voxcast's :class:`TurboAudioStream` (a window of left context and look-ahead per flow chunk, a
    seamless HiFT stream, noise pinned).

Against the one-pass decode of all tokens with (c)'s noise: max abs difference, SNR, a boundary
figure (mean |x[n] - x[n-1]| across chunk boundaries over the one-pass decode's at the same samples:
1 = no seam), and the compute per chunk (first, median, last) and in total.

    python scripts/bench_chatterbox_stream.py [--size full|tiny] [--seconds 20] [--chunk 24]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from benchlib import machine_info, turbo_checkpoint, use_checkout  # noqa: E402

use_checkout()


from voxcast.models.base import LoadOptions  # noqa: E402
from voxcast.models.chatterbox_turbo.hift import SourceNoise  # noqa: E402
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo  # noqa: E402
from voxcast.models.chatterbox_turbo.s3gen_stream import (  # noqa: E402
    SAMPLES_PER_TOKEN,
    TAIL,
    StreamSettings,
    TurboAudioStream,
    one_pass,
    prompt_cache,
    trim_fade,
)
from voxcast.testing.signals import speech_like  # noqa: E402

CROSSFADE = int(0.012 * 24000)


def metrics(streamed: np.ndarray, ref: np.ndarray, bounds: list[int], costs: list[float]) -> dict[str, Any]:
    s, r = torch.from_numpy(streamed), torch.from_numpy(ref)
    n = min(len(s), len(r))
    err = s[:n] - r[:n]
    at = torch.tensor([b - 1 for b in bounds if 0 < b < n])
    jump = (s[1:n] - s[: n - 1]).abs()[at]
    ref_jump = (r[1:n] - r[: n - 1]).abs()[at]
    return {
        "samples": [len(s), len(r)],
        "max_abs_diff": float(err.abs().max()),
        "snr_db": float(10 * torch.log10(r.pow(2).sum() / err.pow(2).sum().clamp_min(1e-30))),
        "boundary_jump_ratio": float(jump.mean() / ref_jump.mean()) if len(at) else None,
        "chunk_ms_first": costs[0] * 1000,
        "chunk_ms_second": costs[1] * 1000 if len(costs) > 1 else None,
        "chunk_ms_median": sorted(costs)[len(costs) // 2] * 1000,
        "chunk_ms_last": costs[-1] * 1000,
        "last_over_second": costs[-1] / costs[1] if len(costs) > 1 else None,
        "chunk_ms": [round(c * 1000, 1) for c in costs],
        "total_s": sum(costs),
        **_flatness(bounds, costs, len(s)),
    }


def _flatness(bounds: list[int], costs: list[float], total: int) -> dict[str, Any]:
    """Cost of the last chunk of the largest size over the first of that size (the ramp's smaller
    chunks left out): ~1.0 when a chunk's cost does not grow with the utterance."""
    sizes = [b - a for a, b in zip([0, *bounds], [*bounds, total], strict=False)][: len(costs)]
    big = max(sizes) if sizes else 0
    same = [c for n, c in zip(sizes, costs, strict=False) if n == big]
    return {
        "chunk_samples": sizes,
        "full_chunks": len(same),
        "full_chunk_last_over_first": same[-1] / same[0] if len(same) > 1 else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--model", type=Path, help="a checkpoint folder (default: build a random one)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--chunk", type=int, default=24, help="tokens per chunk for (a) and (b)")
    ap.add_argument(
        "--prompt-tokens", type=int, default=0, help="(c): keep the last N prompt tokens (0: all)"
    )
    ap.add_argument(
        "--reference-seconds",
        type=float,
        default=10.0,
        help="the voice's reference (S3Gen keeps 10 s: 250 prompt tokens)",
    )
    ap.add_argument("--left", type=int, default=StreamSettings.left)
    ap.add_argument("--right", type=int, default=StreamSettings.right)
    ap.add_argument(
        "--prompt-cache",
        type=int,
        default=StreamSettings.prompt_cache,
        choices=[0, 1],
        help="(c): the voice prompt's rows computed once (1) or in every window (0: exact windows)",
    )
    ap.add_argument(
        "--sweep",
        help="only (c), for these left:right[:prompt cache] windows in tokens, e.g. 8:4,16:4,32:8 or 16:4:0,16:4:1",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "chatterbox-stream.json")
    args = ap.parse_args()
    torch.set_flush_denormal(True)  # random weights drive HiFT into denormals
    folder = args.model or turbo_checkpoint(args.size)
    model = ChatterboxTurbo.from_pretrained(folder, LoadOptions())
    settings = StreamSettings(
        left=args.left, right=args.right, prompt_tokens=args.prompt_tokens, prompt_cache=args.prompt_cache
    )
    voice = model.make_voice(speech_like(args.reference_seconds, 24000, seed=9), 24000, None, False)
    g = torch.Generator().manual_seed(1)
    n = int(args.seconds * 25) - len(TAIL)
    tokens = torch.randint(0, 6561, (n,), generator=g).tolist()
    every = tokens + list(TAIL)
    flow, hift = model.flow, model.hift
    pt, pm, xv = voice.prompt_tokens, voice.prompt_mel.transpose(1, 2), voice.xvector

    warm = TurboAudioStream(
        flow, hift, pt, pm, xv, 0, settings
    )  # first calls create the convolutions' primitives: not timed
    warm.push(tokens[:40])
    warm.finish()

    t0 = time.perf_counter()
    cache = prompt_cache(flow, *settings.trim_prompt(pt, pm.to(flow.input_embedding.weight.dtype)), xv)
    cache_s = time.perf_counter() - t0  # once per voice (when the voice is built or loaded)
    print(f"prompt cache: {cache_s * 1000:.0f} ms once per voice, {cache.nbytes / 2**20:.0f} MiB", flush=True)

    def run_c(st: StreamSettings) -> tuple[TurboAudioStream, np.ndarray, list[float], list[int]]:
        """(c) ours: tokens pushed 4 at a time (as an engine's chunks would bring them)."""
        s = TurboAudioStream(flow, hift, pt, pm, xv, 7, st, cache=cache if st.prompt_cache else None)
        parts, costs, bounds = [], [], []
        for i in range(0, n, 4):
            t0 = time.perf_counter()
            out = s.push(tokens[i : i + 4])
            if len(out):
                costs.append(time.perf_counter() - t0)
                parts.append(out)
                bounds.append(sum(len(p) for p in parts))
        t0 = time.perf_counter()
        parts.append(s.finish())
        costs.append(time.perf_counter() - t0)
        return s, np.concatenate(parts), costs, bounds

    s, ours, costs_c, bounds_c = run_c(settings)
    t0 = time.perf_counter()
    ref = one_pass(
        flow, hift, s.prompt_tokens, s.prompt_mel, xv, torch.tensor([every]), s.noise, s.hift_stream
    )
    one_pass_s = time.perf_counter() - t0
    ref_np = ref.numpy()
    noise_z, hnoise = s.noise, s.hift_stream.noise
    p_frames = 2 * s.prompt_tokens.shape[1]
    if args.sweep:  # (c) with other windows, against the same reference (same tokens and noise)
        sweep = {}
        for item in args.sweep.split(","):
            left, right, *rest = (int(x) for x in item.split(":"))
            pc = rest[0] if rest else args.prompt_cache
            st = StreamSettings(left=left, right=right, prompt_tokens=args.prompt_tokens, prompt_cache=pc)
            _, audio, costs, bounds = run_c(st)
            m = metrics(audio, ref_np, bounds, costs)
            sweep[item] = {
                k: m[k]
                for k in (
                    "max_abs_diff", "snr_db", "boundary_jump_ratio", "chunk_ms_median", "total_s",
                    "chunk_ms", "chunk_samples", "full_chunks", "full_chunk_last_over_first",
                )
            }  # fmt: skip
            print(
                f"left {left:3d} right {right:2d} prompt cache {pc}: max|diff| {m['max_abs_diff']:.2e}  SNR {m['snr_db']:6.1f} dB  "
                f"boundary {m['boundary_jump_ratio']:.2f}  median chunk {m['chunk_ms_median']:.0f} ms  "
                f"last / first full chunk {m['full_chunk_last_over_first'] or 0:.2f}x ({m['full_chunks']} chunks)"
            )
        print(f"one pass (flow + HiFT over all tokens at once): {one_pass_s:.2f} s")
        doc = {
            "machine": machine_info(),
            "config": {k: str(v) for k, v in vars(args).items()},
            "one_pass_s": round(one_pass_s, 3),
            "prompt_cache_ms": round(cache_s * 1000, 1),
            "prompt_cache_mib": round(cache.nbytes / 2**20, 1),
            "sweep": sweep,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")
        return 0

    # (a) independent chunks (pinned noise, phases restarted)
    starts = list(range(0, len(every), args.chunk))
    parts, costs_a = [], []
    fade = trim_fade()
    with torch.inference_mode():
        for a in starts:
            t0 = time.perf_counter()
            b = min(len(every), a + args.chunk)
            z = torch.cat(
                (noise_z[..., :p_frames], noise_z[..., p_frames + 2 * a : p_frames + 2 * b]), dim=-1
            )
            mel = flow(s.prompt_tokens, s.prompt_mel, xv, torch.tensor([every[a:b]]), z)
            sl = slice(a * SAMPLES_PER_TOKEN, b * SAMPLES_PER_TOKEN)
            audio = hift.decode(
                mel, hift.source(hift.f0(mel), SourceNoise(hnoise.phases, hnoise.noise[..., sl]))
            )[0]
            if a == 0:
                audio[: len(fade)] *= fade
            parts.append(audio.numpy())
            costs_a.append(time.perf_counter() - t0)
    independent = np.concatenate(parts)
    bounds_ab = [a * SAMPLES_PER_TOKEN for a in starts[1:]]

    # (b) re-decode everything at every flush, fresh noise each time, 12 ms crossfade
    ramp = torch.linspace(0, 1, CROSSFADE)
    out_b: list[np.ndarray] = []
    held, sent, costs_b = None, 0, []
    gb = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        for k, a in enumerate(starts):
            t0 = time.perf_counter()
            b = min(len(every), a + args.chunk)
            z = torch.randn(1, 80, p_frames + 2 * b, generator=gb)
            mel = flow(s.prompt_tokens, s.prompt_mel, xv, torch.tensor([every[:b]]), z)
            audio = hift.inference(mel, gb)[0]
            audio[: len(fade)] *= fade
            last = k == len(starts) - 1
            end = b * SAMPLES_PER_TOKEN
            new = audio[sent:] if last else audio[sent : end - CROSSFADE]
            if held is not None:
                new = new.clone()
                new[:CROSSFADE] = held * (1 - ramp) + new[:CROSSFADE] * ramp
            out_b.append(new.numpy())
            sent += new.shape[0]
            held = None if last else audio[end - CROSSFADE : end]
            costs_b.append(time.perf_counter() - t0)
    redecode = np.concatenate(out_b)

    doc = {
        "machine": machine_info(),
        "config": {k: str(v) for k, v in vars(args).items()},
        "settings": settings.as_dict(),
        "tokens": len(every),
        "prompt_tokens": int(s.prompt_tokens.shape[1]),
        "one_pass_s": one_pass_s,
        "a_independent": metrics(independent, ref_np, bounds_ab, costs_a),
        "b_redecode_crossfade": metrics(redecode, ref_np, bounds_ab, costs_b),
        "c_voxcast": metrics(ours, ref_np, bounds_c, costs_c),
        "c_flow_calls": [{"chunk": c, "window": w, "ms": round(t * 1000, 1)} for c, w, t in s.flow_calls],
    }
    print(
        f"{args.size} Turbo S3Gen+HiFT, {args.seconds:.0f} s ({len(every)} tokens, prompt {doc['prompt_tokens']}), "
        f"(a)/(b) chunks of {args.chunk}; one pass {one_pass_s:.2f} s"
    )
    print("strategy                  max|diff|   SNR dB  boundary  chunk ms first/2nd/median/last  total s")
    for name in ("a_independent", "b_redecode_crossfade", "c_voxcast"):
        m = doc[name]
        jump = m["boundary_jump_ratio"]
        print(
            f"{name:24s}  {m['max_abs_diff']:9.2e}  {m['snr_db']:7.1f}  {jump if jump is None else round(jump, 2)!s:>8}"
            f"  {m['chunk_ms_first']:6.0f} / {m['chunk_ms_second'] or 0:6.0f} / {m['chunk_ms_median']:6.0f} / {m['chunk_ms_last']:6.0f}"
            f"  {m['total_s']:7.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
