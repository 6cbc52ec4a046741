"""Benchmark a new reference's voice build, part by part, and the implementations of each part.

A request that brings reference audio never seen before builds its voice before its prefill: the
x-vector (speaker encoder), the reference codes (codec encoder) and the audio decoder's priming.
Full-size random weights (the 0.6B Base speaker encoder, the speech tokenizer's encoder and
decoder), a synthetic reference of ``--seconds``. Variants of a part run alternated in one process
(A, B, B, A, ...) after one warm-up each; medians are printed with their ratios:

- codec encoder: transformers' Mimi convolution stack (``gemm_seanet=False``), voxcast's
  :class:`~voxcast.kernels.seanet_gemm.GemmSeanet`, and GemmSeanet with the C++ ELU (the
  int8 default); the codes of all three are checked equal;
- speaker encoder: PyTorch's convolutions (float32 default) vs matrix products (int8 default);
- priming the audio decoder with the reference codes.

Runs on the calling thread; in the engine a voice is built on a fresh thread, which measured up to
1.3x slower on a 2-core AMD Zen 3. Writes ``bench-results/voice.json``.

    python scripts/bench_voice.py [--seconds 3.0] [--reps 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]

from benchlib import machine_info  # noqa: E402

from voxcast.audio.reference import synthetic_reference_audio  # noqa: E402
from voxcast.kernels import native as int8_kernel  # noqa: E402
from voxcast.models.qwen3_tts.codec_decoder import CodecDecoder, CodecDecoderConfig  # noqa: E402
from voxcast.models.qwen3_tts.codec_encoder import CodecEncoder, build_mimi_encoder  # noqa: E402
from voxcast.models.qwen3_tts.config import SpeakerEncoderConfig  # noqa: E402
from voxcast.models.qwen3_tts.speaker_encoder import SpeakerEncoder, extract_xvector  # noqa: E402
from voxcast.testing.qwen3_tts import model_config_dict  # noqa: E402
from voxcast.testing.qwen3_tts_parts import speech_tokenizer_config  # noqa: E402

SR = 24000


def _ms(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def alternate(variants: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Median ms of each variant, run alternated (order reversed every other round) after a warm-up."""
    for fn in variants.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(reps):
        for name in names if i % 2 == 0 else names[::-1]:
            times[name].append(_ms(variants[name]))
    return {name: statistics.median(v) for name, v in times.items()}


def codec_encoders() -> dict[str, CodecEncoder]:
    """The three codec-encoder variants on the same seeded random full-size weights."""
    torch.manual_seed(0)
    mimi = build_mimi_encoder(speech_tokenizer_config("full")["encoder_config"]).eval()
    with torch.no_grad():
        for name, buf in mimi.named_buffers():
            if name.endswith("embed_sum"):
                buf.copy_(torch.randn(buf.shape))  # distinct codebook entries, as a trained codec
    out = {
        "transformers": CodecEncoder(copy.deepcopy(mimi), gemm_seanet=False),
        "gemm": CodecEncoder(copy.deepcopy(mimi)),
    }
    fast = CodecEncoder(mimi)
    if fast.use_fast_elu(True):
        out["gemm + C++ ELU"] = fast
    return out


def speaker_encoder() -> SpeakerEncoder:
    cfg = model_config_dict("base", "0.6b")["speaker_encoder_config"]
    torch.manual_seed(1)
    return SpeakerEncoder(SpeakerEncoderConfig.from_dict(cfg)).eval()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="reference length (s)")
    ap.add_argument("--reps", type=int, default=8, help="timed runs of each variant")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    wav = synthetic_reference_audio(SR, seconds=args.seconds).astype(np.float32)

    encoders = codec_encoders()
    codes = {name: enc.encode(wav) for name, enc in encoders.items()}
    same = all(torch.equal(c, codes["transformers"]) for c in codes.values())
    enc_ms = alternate({n: (lambda e=e: e.encode(wav)) for n, e in encoders.items()}, args.reps)

    spk = speaker_encoder()

    def xvector(gemm: bool) -> Any:
        spk.use_gemm_convs(gemm)
        return extract_xvector(spk, wav)

    spk_ms = alternate({"pytorch": lambda: xvector(False), "products": lambda: xvector(True)}, args.reps)

    torch.manual_seed(2)
    dec_cfg = speech_tokenizer_config("full")["decoder_config"]
    decoder = CodecDecoder(CodecDecoderConfig.from_dict(dec_cfg)).eval().prepare()
    ref_codes = codes["transformers"]
    prime_ms = alternate({"prime": lambda: decoder.new_stream(ref_codes)}, args.reps)["prime"]

    best_enc = enc_ms.get("gemm + C++ ELU", enc_ms["gemm"])
    result = {
        "seconds": args.seconds,
        "reference_frames": int(ref_codes.shape[0]),
        "codec_encoder_ms": enc_ms,
        "codes_equal": same,
        "speaker_encoder_ms": spk_ms,
        "priming_ms": prime_ms,
        "voice_build_ms": {
            "float32 model": enc_ms["gemm"] + spk_ms["pytorch"] + prime_ms,
            "int8 model": best_enc + spk_ms["products"] + prime_ms,
            "before (transformers' stack)": enc_ms["transformers"] + spk_ms["pytorch"] + prime_ms,
        },
        "int8_kernel": int8_kernel.load(),
        "machine": machine_info(),
    }
    print(
        f"reference {args.seconds:.2f} s ({result['reference_frames']} frames), {args.reps} runs each, alternated"
    )
    base = enc_ms["transformers"]
    for name, ms in enc_ms.items():
        print(f"  codec encoder, {name:16s} {ms:7.1f} ms  (x{ms / base:.2f})")
    print(f"  codes equal across variants: {same}")
    for name, ms in spk_ms.items():
        print(f"  speaker encoder, {name:14s} {ms:7.1f} ms  (x{ms / spk_ms['pytorch']:.2f})")
    print(f"  priming the audio decoder     {prime_ms:7.1f} ms")
    for name, ms in result["voice_build_ms"].items():
        print(f"  voice build, {name:28s} {ms:7.1f} ms")
    out = ROOT / "bench-results" / "voice.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
