"""The 12 Hz speech-tokenizer decoder of Qwen3-TTS (codes -> 24 kHz waveform), built to stream exactly.

The network is strictly causal: split RVQ lookup -> causal conv -> 8-layer transformer with a
causal sliding window of 72 frames -> 2 x (transposed conv + ConvNeXt) -> causal conv -> 4
SnakeBeta/transposed-conv/residual blocks -> causal conv -> clamp. Every causal convolution keeps
its last ``(kernel - 1) * dilation`` inputs as state, every transposed convolution its last
``ceil(kernel / stride) - 1`` inputs, every attention layer the keys/values of its last
``window - 1`` frames. With that state a chunk of new frames costs O(new frames), and any chunk
schedule reproduces the one-pass decode (to float rounding, ~1e-7).

Parameter names equal the ``decoder.*`` keys of the official ``speech_tokenizer/model.safetensors``
(minus that prefix), so the official weights load with ``strict=True``.

The building blocks (and the weight folding that makes a frame cheap) live in :mod:`.codec_layers`,
the quantizer lookup in :mod:`.codec_quantizer`.

Streams never modify a stored tensor in place: a :class:`StreamingDecoder` is cloned by copying
two short lists (:meth:`StreamingDecoder.clone`), which is how a voice's primed state (decoder run
over the reference codes once) is shared by every request of that voice.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from voxcast.kernels.rows_linear import onednn_available, set_flags

from .codec_layers import (
    Attention,
    CausalConv,
    CausalTransConv,
    CodecDecoderConfig,
    ConvNeXtBlock,
    DecoderBlock,
    SnakeBeta,
    Transformer,
    _State,
)
from .codec_quantizer import SplitQuantizer

__all__ = [
    "SAMPLES_PER_FRAME",
    "CodecDecoder",
    "CodecDecoderConfig",
    "StreamingDecoder",
    "load_codec_decoder",
]

logger = logging.getLogger(__name__)

#: Output samples per codec frame (24 kHz / 12.5 Hz).
SAMPLES_PER_FRAME = 1920


# --------------------------------------------------------------------------- decoder


class CodecDecoder(nn.Module):
    """Codes [T, 16] -> waveform [T * 1920]; parameter names as the official ``decoder.*`` keys."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.config = cfg
        self.quantizer = SplitQuantizer(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = Transformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)]
            )
            for r in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        blocks: list[nn.Module] = [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
        blocks += [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
        blocks += [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)]
        self.decoder = nn.ModuleList(blocks)
        #: The short-GEMM kernel :meth:`prepare` chose, ``{"onednn": bool}`` (None: not float32 CPU).
        self.small_gemm: dict[str, object] | None = None
        self._n_conv = self._n_attn = 0
        for m in self.modules():
            if isinstance(m, (CausalConv, CausalTransConv)):
                m.slot, self._n_conv = self._n_conv, self._n_conv + 1
            elif isinstance(m, Attention):
                m.slot, self._n_attn = self._n_attn, self._n_attn + 1

    def prepare(self) -> CodecDecoder:
        """Fold the weights now (one 1-frame decode) so that the first stream does not pay for it,
        and put the short GEMMs on their kernel (:meth:`_choose_small_gemm`).

        Folded tensors (:func:`~.codec_layers._fold`) follow later weight changes by themselves.
        """
        self.small_gemm = self._choose_small_gemm()
        self.decode_offline(torch.zeros(1, self.config.num_quantizers, dtype=torch.long))
        return self

    def _choose_small_gemm(self) -> dict[str, object] | None:
        """Short GEMMs on oneDNN (``onednn_small``: the convolutions' and the transformer's
        projections for chunks of up to ``SMALL_DIM`` frames) wherever this PyTorch has oneDNN.

        A fixed rule, not a timing: the two kernels round differently (the audio moves by ~2e-7,
        which moves some 16-bit samples by one step), so a choice timed at load would make the same
        request's bytes depend on how busy the host was at that moment. Float32 on the CPU only
        (elsewhere None). oneDNN was the faster on the real decoder wherever measured: an AMD Zen 3
        (1.56x at one-frame chunks) and an AMD Zen 2 (0.76-0.77x the time a frame at one-frame
        chunks, 0.88-0.91x at four); the tiny test checkpoint's decoder, whose weights fit in
        the caches, takes 1.3x PyTorch's time there (3.2 -> 4.2 ms a frame), which nothing needs.
        """
        w = self.pre_conv.conv.weight
        if w.device.type != "cpu" or w.dtype != torch.float32 or not onednn_available():
            return None
        set_flags(self, "onednn_small", True)
        return {"onednn": True}

    def _fresh_state(self) -> _State:
        return _State([None] * self._n_conv, [None] * self._n_attn)

    def _front(self, codes: Tensor, st: _State) -> Tensor:  # codes: [B, T, Q] -> [B, latent, T]
        h = self.quantizer.decode(codes.transpose(1, 2))  # [B, codebook_dim, T]
        h = self.pre_conv(h, st).transpose(1, 2)  # [B, T, latent]
        return self.pre_transformer(h, st).permute(0, 2, 1)

    def _back(self, h: Tensor, st: _State) -> Tensor:  # h: [B, latent, T] -> [B, T * spf]
        for pair in self.upsample:  # [CausalTransConv, ConvNeXtBlock]
            h = pair[1](pair[0](h, st), st)  # type: ignore[index]
        for layer in self.decoder:
            h = layer(h) if isinstance(layer, SnakeBeta) else layer(h, st)
        return h.clamp(min=-1.0, max=1.0).squeeze(1)

    def _run(self, codes: Tensor, st: _State) -> Tensor:  # codes: [B, T, Q] -> [B, T * spf]
        return self._back(self._front(codes, st), st)

    def _back_modules(self) -> list[nn.Module]:
        """The conv stack after the transformer, in order (each takes ``(h, st)`` but SnakeBeta ``(h)``)."""
        mods: list[nn.Module] = []
        for pair in self.upsample:
            assert isinstance(pair, nn.ModuleList)
            mods += list(pair)
        return mods + list(self.decoder)

    def _back_needs(self) -> list[int]:
        """Per conv-stack module, the inputs (its last ones) that fix its every state after a prime.

        Walked backwards from the last conv, whose output priming discards (0 samples needed): each
        module needs the inputs that determine the outputs its successor needs, plus its own tail.
        ``[0]`` is in frames of transformer output (~10 for the real model).
        """
        needs, n = [], 0
        for m in reversed(self._back_modules()):
            n = m.needed_input(n)  # type: ignore[operator]
            needs.append(n)
        return needs[::-1]

    def _back_context_frames(self) -> int:
        """Frames of transformer output that determine the conv stack's state (its receptive field)."""
        return self._back_needs()[0]

    def _prime_back(self, h: Tensor, st: _State) -> None:
        """Bring the conv stack's state to the end of ``h`` [B, latent, T], computing only what it needs.

        Each module runs on just the inputs its state and its successor's needs depend on (a few
        hundred samples at the 24 kHz end instead of ~10 frames x 1920), so priming a voice costs a
        fraction of decoding those frames. The state equals a full run's up to float rounding
        (different GEMM widths).
        """
        for m, need in zip(self._back_modules(), self._back_needs(), strict=True):
            h = h[..., -need:]
            h = m(h) if isinstance(m, SnakeBeta) else m(h, st)

    def _check_codes(self, codes: Tensor) -> Tensor:
        if codes.dim() != 2 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"codes must be [T, {self.config.num_quantizers}], got {tuple(codes.shape)}")
        return codes.to(device=self.pre_conv.conv.weight.device, dtype=torch.long)

    @torch.inference_mode()
    def decode_offline(self, codes: Tensor) -> np.ndarray:
        """One-pass decode of all frames (the reference for the streaming decoder).

        Args:
            codes: LongTensor [T, Q] of codec codes.

        Returns:
            float32 waveform [T * samples_per_frame] in [-1, 1].
        """
        codes = self._check_codes(codes)
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        wav = self._run(codes[None], self._fresh_state())[0]
        return wav.float().cpu().numpy()

    def new_stream(self, prime_codes: Tensor | None = None) -> StreamingDecoder:
        """A stream with fresh state, optionally primed with reference codes (audio discarded).

        Priming runs the transformer over every reference frame but the conv stack only over what
        its final state depends on (:meth:`_prime_back`: the last ~10 frames at the transformer,
        narrowing to a few hundred samples at the output): the state after the reference is the
        same, at a fraction of a full decode. Call it once per voice and
        :meth:`StreamingDecoder.clone` the result for every request. The stream then returns
        exactly the generated frames' samples. (The official wrapper decodes ref ++ gen and drops
        ``int(ref / total * total * 1920)`` samples: ``ref * 1920``, or one fewer where the float
        quotient rounds down, leaving the reference's last sample in front of its clip.)
        """
        st = self._fresh_state()
        if prime_codes is not None and prime_codes.shape[0] > 0:
            codes = self._check_codes(prime_codes)
            with torch.inference_mode():
                self._prime_back(self._front(codes[None], st), st)
        stream = StreamingDecoder(self, st)
        stream.primed_frames = st.position
        return stream


class StreamingDecoder:
    """Stateful incremental decode: ``decode(codes [T, Q]) -> float32 [T * 1920]``.

    The concatenation of the outputs over any chunk schedule equals
    :meth:`CodecDecoder.decode_offline` of all frames (max abs diff ~1e-7 in fp32). Not thread-safe;
    one instance per request (clones share nothing mutable).
    """

    def __init__(self, model: CodecDecoder, state: _State):
        self.model = model
        self._state = state
        self.primed_frames = 0

    @property
    def frames_decoded(self) -> int:
        """Frames run through this stream so far, including priming frames."""
        return self._state.position

    def decode(self, codes: Tensor) -> np.ndarray:
        """Decode the next frames.

        Args:
            codes: LongTensor [T, Q] (T may be 0).

        Returns:
            float32 waveform [T * samples_per_frame]: exactly the samples these frames add.
        """
        codes = self.model._check_codes(codes)
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        with torch.inference_mode():
            wav = self.model._run(codes[None], self._state)[0]
        return wav.float().cpu().numpy()

    def clone(self) -> StreamingDecoder:
        """An independent copy of this stream (cheap: the state's tensors are shared read-only)."""
        out = StreamingDecoder(self.model, self._state.copy())
        out.primed_frames = self.primed_frames
        return out


def load_codec_decoder(
    speech_tokenizer_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CodecDecoder:
    """Load the decoder from an official ``speech_tokenizer`` folder (config.json + model.safetensors).

    Raises:
        FileNotFoundError: a file is missing.
        RuntimeError: the weights do not match the config (strict load).
    """
    d = Path(speech_tokenizer_dir)
    cfg = CodecDecoderConfig.from_dict(json.loads((d / "config.json").read_text())["decoder_config"])
    tensors = load_file(str(d / "model.safetensors"))
    state = {k[len("decoder.") :]: v for k, v in tensors.items() if k.startswith("decoder.")}
    model = CodecDecoder(cfg)
    model.load_state_dict(state, strict=True)
    logger.info("codec decoder loaded from %s (%d tensors)", d, len(state))
    return model.to(device=device, dtype=dtype).eval().prepare()
