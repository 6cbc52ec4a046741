"""T3's shapes, read from the checkpoint's tensors (the official files carry no config: upstream
hard-codes GPT-2 medium; the same rules describe GPT-2 small, Nano, and the tiny test checkpoints)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

from voxcast.errors import CheckpointError

__all__ = ["T3Config"]

#: GPT-2's attention heads are 64 wide at every published size (small 768/12, medium 1024/16).
HEAD_DIM = 64


@dataclass(frozen=True)
class T3Config:
    """What T3 needs to know of a checkpoint.

    Attributes:
        layers / width / heads: the GPT-2 backbone (heads = width / 64 unless given).
        positions: learned absolute positions (GPT-2 medium in Turbo: 8196).
        text_vocab / speech_vocab: embedding sizes (Turbo: 50276 text, 6563 speech = 6561 + start + stop).
        speaker_dim: the VoiceEncoder embedding T3 is conditioned on (256).
        start_speech / stop_speech: the speech start and stop tokens (6561, 6562).
        eps: the layer norms' epsilon.
    """

    layers: int
    width: int
    heads: int
    positions: int
    text_vocab: int
    speech_vocab: int
    speaker_dim: int = 256
    start_speech: int = 6561
    stop_speech: int = 6562
    eps: float = 1e-5

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor], *, heads: int | None = None) -> T3Config:
        """The config a ``t3_turbo_v1.safetensors`` state describes.

        Raises:
            CheckpointError: a key the layout needs is missing.
        """
        try:
            width = int(tensors["tfmr.wpe.weight"].shape[1])
            positions = int(tensors["tfmr.wpe.weight"].shape[0])
            layers = 1 + max(int(k.split(".")[2]) for k in tensors if k.startswith("tfmr.h."))
            text_vocab = int(tensors["text_emb.weight"].shape[0])
            speech_vocab = int(tensors["speech_emb.weight"].shape[0])
            speaker_dim = int(tensors["cond_enc.spkr_enc.weight"].shape[1])
        except (KeyError, ValueError, IndexError) as e:
            raise CheckpointError(f"not a Chatterbox Turbo T3 state: {e} is missing") from e
        heads = heads or max(1, width // HEAD_DIM)
        if width % heads:
            raise CheckpointError(f"T3 width {width} is not a multiple of {heads} heads")
        return cls(layers, width, heads, positions, text_vocab, speech_vocab, speaker_dim)
