"""Chatterbox Turbo served by voxcast's engine vs the official package, same random weights, one run:
T3 ms per token, S3Gen + HiFT cost per chunk, time to first audio, real-time
factor, 1/2/4 concurrent streams' throughput, and the official pipeline's total for the same text,
voice and length.

Random weights rarely draw T3's stop token at a chosen length, so the checkpoint is built with no
stop bias and every utterance runs to ``--tokens`` (250 = 10 s): the engine's request sets
``max_frames``, the official run calls ``generate``'s body with ``max_gen_len`` (its T3 loop, then
S3Gen's ``inference``; the watermark is left out on both sides).

    python scripts/bench_chatterbox_turbo.py [--size full] [--tokens 250] [--streams 1,2,4]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

ROOT = Path(__file__).resolve().parents[1]
from benchlib import machine_info, turbo_checkpoint, use_checkout  # noqa: E402

use_checkout()


from voxcast.config import EngineConfig  # noqa: E402
from voxcast.engine.engine import Engine  # noqa: E402
from voxcast.testing.signals import speech_like  # noqa: E402

TEXT = "Thank you for calling the support line. Your call matters to us, so please stay on the line."


def run_stream(engine: Engine, voice: Any, tokens: int, seed: int) -> dict[str, Any]:
    stream = engine.synthesize({"text": TEXT, "seed": seed, "max_frames": tokens}, voice=voice)
    t0 = time.perf_counter()
    chunks = list(stream)
    wall = time.perf_counter() - t0
    t = stream.timing
    audio_s = sum(len(c.pcm) for c in chunks) / 24000
    return {
        "ttfa_ms": t.ttfa_ms, "total_ms": t.total_ms, "frames": t.frames, "chunks": len(chunks),
        "audio_s": audio_s, "rtf": t.rtf, "t3_ms_per_token": t.talker_ms / max(1, t.frames),
        "stalls": t.stalls, "stall_ms": t.stall_ms,
        "decode_ms_total": t.codec_ms, "prefill_ms": t.prefill_ms, "wall_s": wall,
    }  # fmt: skip


def decode_alone(model: Any, voice: Any, tokens: int) -> dict[str, Any]:
    """S3Gen + HiFT streamed on their own (no T3 running beside them): per-chunk cost."""
    ids = torch.randint(0, 6561, (tokens,), generator=torch.Generator().manual_seed(3)).tolist()
    dec = model.new_decoder(voice, seed=1)
    walls = []
    for i in range(0, tokens, 4):
        t0 = time.perf_counter()
        if len(dec.decode(torch.tensor(ids[i : i + 4])[:, None])):
            walls.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    dec.finish()
    walls.append((time.perf_counter() - t0) * 1000)
    calls = dec.stream.flow_calls
    return {
        "chunk_ms": [round(w, 1) for w in walls],
        "flow_and_hift_ms": [round(c[2] * 1000, 1) for c in calls],
        "total_s": sum(walls) / 1000,
        "audio_s": (tokens + 3) * 0.04,
    }


def official_run(folder: Path, size: str, voice: Any, tokens: int, seed: int) -> dict[str, Any]:
    """The official pipeline (generate's body with ``max_gen_len``) on the same weights and voice."""
    from safetensors.torch import load_file
    from tests.parity._official_chatterbox_generate import import_official_tts, official_tts

    from voxcast.models.chatterbox_turbo.s3gen_estimator import EstimatorConfig
    from voxcast.testing.chatterbox_turbo import HIFT_SIZES, SIZES

    mod = import_official_tts()
    if mod is None:
        return {"skipped": "chatterbox-tts (and its parity-test imports) not installed"}
    layers, width, _ = SIZES[size]
    cfg = EstimatorConfig.from_tensors(
        load_file(str(folder / "s3gen_meanflow.safetensors")), "flow.decoder.estimator."
    )
    tts = official_tts(folder, (layers, width, width // 64), cfg, HIFT_SIZES[size])
    cond_mod = sys.modules["chatterbox.models.t3.modules.cond_enc"]
    t3_cond = cond_mod.T3Cond(
        speaker_emb=voice.speaker,
        cond_prompt_speech_tokens=voice.t3_tokens,
        emotion_adv=0.0 * torch.ones(1, 1, 1),
    )
    gen = {
        "prompt_token": voice.prompt_tokens, "prompt_token_len": torch.tensor([voice.prompt_tokens.shape[1]]),
        "prompt_feat": voice.prompt_mel, "prompt_feat_len": None, "embedding": voice.xvector,
    }  # fmt: skip
    text = mod.punc_norm(TEXT)
    ids = tts.tokenizer(text, return_tensors="pt", padding=True, truncation=True).input_ids
    torch.manual_seed(seed)
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        torch.inference_mode(),
    ):
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        speech = tts.t3.inference_turbo(t3_cond=t3_cond, text_tokens=ids, max_gen_len=tokens)
        t1 = time.perf_counter()
        speech = speech[speech < 6561]
        speech = torch.cat([speech, torch.tensor([4299, 4299, 4299])])
        mel = tts.s3gen.flow_inference(speech, ref_dict=dict(gen), n_cfm_timesteps=2, finalize=True)
        t2 = time.perf_counter()
        wav, _ = tts.s3gen.hift_inference(mel, None)
        t3 = time.perf_counter()
    return {
        "tokens": int(speech.numel()), "audio_s": wav.shape[-1] / 24000, "t3_s": t1 - t0, "flow_s": t2 - t1,
        "hift_s": t3 - t2, "total_s": t3 - t0, "t3_ms_per_token": (t1 - t0) * 1000 / max(1, int(speech.numel()) - 3),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument(
        "--model", type=Path, help="checkpoint folder (default: .cache/bench-models/turbo-<size>-nostop)"
    )
    ap.add_argument("--tokens", type=int, default=250, help="speech tokens per utterance (25 a second)")
    ap.add_argument("--streams", default="1,2,4")
    ap.add_argument("--no-official", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--decode-thread", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--threads", type=int, default=0, help="VOXCAST_THREADS (0: torch's default)")
    ap.add_argument("--quant", default="none", choices=["none", "int8"], help="T3's weights (int8: CPU only)")
    ap.add_argument(
        "--prompt-cache",
        type=int,
        default=1,
        choices=[0, 1],
        help="S3Gen's voice prompt computed once per voice (1, the default) or in every window (0: exact)",
    )
    ap.add_argument(
        "--static-decode",
        type=int,
        default=0,
        choices=[0, 1],
        help="T3 with a static key/value cache, batched (a CUDA graph per batch bucket on CUDA)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "chatterbox-turbo.json")
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    folder = turbo_checkpoint(args.size, args.model)
    t0 = time.perf_counter()
    base = EngineConfig.from_env(os.environ)  # VOXCAST_* settings the flags below do not name apply
    engine = Engine.load(
        replace(
            base,
            model=str(folder),
            device=args.device,
            dtype=args.dtype,
            decode_thread=args.decode_thread,
            quant=args.quant,
            threads=args.threads,
            max_active=max(map(int, args.streams.split(","))),
            settings={
                **base.settings,
                "turbo_prompt_cache": args.prompt_cache,
                "turbo_static_decode": bool(args.static_decode),
            },
        )
    )
    ready_s = time.perf_counter() - t0
    buf = io.BytesIO()
    sf.write(buf, speech_like(10.0, 24000, seed=9), 24000, format="WAV")
    t0 = time.perf_counter()
    voice = engine.create_voice(buf.getvalue(), None)
    voice_s = time.perf_counter() - t0
    run_stream(engine, voice, 16, seed=0)  # this voice's first use: not timed
    decode_only = decode_alone(engine.model, voice, args.tokens)
    doc: dict[str, Any] = {
        "machine": machine_info(), "config": {k: str(v) for k, v in vars(args).items()},
        "ready_s": ready_s, "voice_build_s": voice_s, "prompt_tokens": int(voice.prompt_tokens.shape[1]),
        "stream_settings": engine.model.stream_settings.as_dict(), "decode_only": decode_only, "streams": {},
        "runtime": engine.model.runtime_report(),
    }  # fmt: skip
    for n in map(int, args.streams.split(",")):
        results: list[dict[str, Any]] = [{} for _ in range(n)]

        def work(i: int, results: list[dict[str, Any]] = results) -> None:
            results[i] = run_stream(engine, voice, args.tokens, seed=100 + i)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        frames = sum(r["frames"] for r in results)
        doc["streams"][str(n)] = {
            "per_stream": results, "wall_s": wall, "tokens_per_s": frames / wall,
            "ttfa_ms_median": float(np.median([r["ttfa_ms"] for r in results])),
            "rtf_median": float(np.median([r["rtf"] for r in results])),
            "stalled_streams": sum(1 for r in results if r["stalls"]),
        }  # fmt: skip
        print(
            f"{n} stream(s): {frames / wall:.1f} tokens/s, TTFA median {doc['streams'][str(n)]['ttfa_ms_median']:.0f} ms, "
            f"{doc['streams'][str(n)]['stalled_streams']} stalled"
        )
    engine.close()
    if not args.no_official and args.device == "cpu":
        doc["official"] = official_run(folder, args.size, voice, args.tokens, seed=100)
        off = doc["official"]
        if "total_s" in off:
            one = doc["streams"].get("1", {}).get("per_stream", [{}])[0]
            doc["ttfa_over_official_total"] = one.get("ttfa_ms", 0) / 1000 / off["total_s"]
            print(
                f"official: {off['total_s']:.1f} s for {off['audio_s']:.1f} s of audio "
                f"(T3 {off['t3_ms_per_token']:.0f} ms/token, flow {off['flow_s']:.1f} s, HiFT {off['hift_s']:.1f} s); "
                f"our first audio / official total = {doc['ttfa_over_official_total']:.3f}"
            )
    one = doc["streams"].get("1", {}).get("per_stream", [None])[0]
    if one:
        print(
            f"one stream: first audio {one['ttfa_ms']:.0f} ms, RTF {one['rtf']:.2f}, T3 {one['t3_ms_per_token']:.0f} ms/token, "
            f"{one['chunks']} chunks, decode {one['decode_ms_total'] / 1000:.1f} s in all, "
            f"{one['stalls']} playback stalls ({one['stall_ms']:.0f} ms)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    d = doc["decode_only"]
    print(
        f"S3Gen + HiFT alone: {d['total_s']:.2f} s for {d['audio_s']:.1f} s of audio; chunks {d['chunk_ms']} ms"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
