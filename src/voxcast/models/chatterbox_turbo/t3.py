"""T3: text tokens -> 25 Hz speech tokens, conditioned on a voice (a VoiceEncoder speaker embedding and
up to 375 speech tokens of its reference), on the GPT-2 backbone of :mod:`.gpt2`.

The input is ``[speaker (1 position) | speech_emb(prompt tokens) | text_emb(text) | speech_emb(start)]``:
the conditioning part does not depend on the text, so its keys and values can be computed once per
voice (:meth:`T3.prefix`) and every request continues from a copy. Module names follow the official
``t3_turbo_v1.safetensors`` so that its state loads as it is (:func:`load_t3`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor, nn

from voxcast.models.chatterbox_turbo.config import T3Config
from voxcast.models.chatterbox_turbo.gpt2 import GPT2, KVCache
from voxcast.models.chatterbox_turbo.sampling import TurboSampling, sample
from voxcast.models.chatterbox_turbo.state import check_state, read_state

__all__ = ["T3", "T3_FILE", "SlotDecoder", "TokenStream", "load_t3", "next_many"]

log = logging.getLogger(__name__)


class SlotDecoder(Protocol):
    """What a :class:`TokenStream` asks of the static decoder holding its slot
    (:class:`~.t3_static.StaticT3`; a protocol here so that this module does not import it)."""

    def step(self, streams: Sequence[TokenStream]) -> list[int | None]:
        """The next token of each admitted stream, one batched step."""
        ...

    def release(self, stream: TokenStream) -> None:
        """Give ``stream``'s slot back."""
        ...


T3_FILE = "t3_turbo_v1.safetensors"
#: Tensors of the official state that inference never reads (GPT-2's token embedding, which upstream
#: deletes after loading, and the text head), and buffers older ``transformers`` saved.
_UNUSED = ("tfmr.wte.weight", "text_head.weight")
_BUFFERS = (".attn.bias", ".attn.masked_bias")


class CondEnc(nn.Module):
    """The speaker embedding's projection (``cond_enc.spkr_enc``)."""

    def __init__(self, cfg: T3Config) -> None:
        super().__init__()
        self.spkr_enc = nn.Linear(cfg.speaker_dim, cfg.width)


class T3(nn.Module):
    def __init__(self, cfg: T3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.tfmr = GPT2(cfg)
        self.cond_enc = CondEnc(cfg)
        self.text_emb = nn.Embedding(cfg.text_vocab, cfg.width)
        self.speech_emb = nn.Embedding(cfg.speech_vocab, cfg.width)
        self.speech_head = nn.Linear(cfg.width, cfg.speech_vocab, bias=True)

    def conditioning(self, speaker: Tensor, prompt_tokens: Tensor | None) -> Tensor:
        """``[B, 1 + P, width]``: the projected speaker embedding ``speaker [B, speaker_dim]`` and the
        reference's speech tokens ``prompt_tokens [B, P]`` (or none)."""
        spk = self.cond_enc.spkr_enc(speaker.view(-1, self.cfg.speaker_dim))[:, None]
        if prompt_tokens is None:
            return spk
        return torch.cat((spk, self.speech_emb(prompt_tokens)), dim=1)

    def prefix(self, conditioning: Tensor) -> KVCache:
        """The keys and values of a voice's conditioning positions (what every request starts from)."""
        cache = KVCache()
        self.tfmr(conditioning, cache)
        return cache

    def stream(
        self,
        text_tokens: Tensor,
        *,
        conditioning: Tensor | None = None,
        prefix: KVCache | None = None,
        sampling: TurboSampling | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        max_tokens: int = 1001,
    ) -> TokenStream:
        """Speech tokens for ``text_tokens [1, T]`` (no start/stop text tokens), one at a time.

        Give either the voice's ``conditioning`` (:meth:`conditioning`) or its computed ``prefix``
        (:meth:`prefix`; cloned, so it can serve other requests): both give the same tokens. The draws
        come from ``generator``, else from a generator seeded with ``seed``, else PyTorch's global one.
        """
        if (conditioning is None) == (prefix is None):
            raise ValueError("give conditioning or prefix, not both")
        start = torch.full((text_tokens.shape[0], 1), self.cfg.start_speech, device=text_tokens.device)
        tail = torch.cat((self.text_emb(text_tokens), self.speech_emb(start)), dim=1)
        if prefix is not None:
            cache, embeds = prefix.clone(), tail
        else:
            assert conditioning is not None
            cache, embeds = KVCache(), torch.cat((conditioning.expand(tail.shape[0], -1, -1), tail), dim=1)
        if generator is None and seed is not None:
            generator = torch.Generator(device=text_tokens.device).manual_seed(seed)
        return TokenStream(self, cache, embeds, start, sampling or TurboSampling(), generator, max_tokens)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.speech_head(hidden)


class TokenStream:
    """One request's speech tokens: :meth:`next` runs T3 one position and draws a token; None after
    the stop token (not returned) or ``max_tokens``. The official loop's order: the first draw sees
    the start token as the previous tokens, later draws the tokens generated so far."""

    def __init__(
        self,
        t3: T3,
        cache: KVCache,
        embeds: Tensor,
        start: Tensor,
        sampling: TurboSampling,
        generator: torch.Generator | None,
        max_tokens: int,
    ) -> None:
        self.t3, self.cache, self.sampling, self.generator = t3, cache, sampling, generator
        self.max_tokens = max_tokens
        self._embeds: Tensor | None = embeds
        self._start = start
        self.tokens: list[Tensor] = []
        self.done = False
        #: the :class:`~.t3_static.StaticT3` slot holding its cache once it decodes there
        self.slot: int | None = None
        self.slot_ticket: object = None
        self.static: SlotDecoder | None = None

    @property
    def steady(self) -> bool:
        """Prefilled and not done: the next position is one token (it can join a batched step)."""
        return not self.done and self._embeds is None

    @torch.inference_mode()
    def prefill_part(self, max_positions: int) -> bool:
        """Run at most ``max_positions`` of the prompt's positions still to run; True once only the
        last one is left (the next :meth:`next` runs it and draws the first token). A scheduler
        interleaves these parts with other streams' tokens; the result equals the one-pass prefill up
        to float rounding (as a prefix-cache hit does)."""
        if self._embeds is None:
            return True
        n = min(max(1, max_positions), self._embeds.shape[1] - 1)
        if n > 0:
            self.t3.tfmr(self._embeds[:, :n], self.cache)
            self._embeds = self._embeds[:, n:]
        return self._embeds.shape[1] <= 1

    @torch.inference_mode()
    def next(self) -> int | None:
        if self.done:
            return None
        if self.static is not None and self.slot is not None:
            return self.static.step([self])[0]
        if self._embeds is not None:
            embeds, self._embeds = self._embeds, None
            previous = self._start
        else:
            embeds = self.t3.speech_emb(self.tokens[-1])
            previous = torch.cat(self.tokens, dim=1)
        hidden = self.t3.tfmr(embeds, self.cache)
        return self._take(self.t3.logits(hidden[:, -1:])[:, -1, :], previous)

    def _take(self, logits: Tensor, previous: Tensor) -> int | None:
        token = sample(logits, previous, self.sampling, self.generator)
        return self._took(token, int(token[0, 0]))

    def _took(self, token: Tensor, value: int) -> int | None:
        """Record the drawn ``token [1, 1]`` (``value`` its id); None after the stop token."""
        self.tokens.append(token)
        if value == self.t3.cfg.stop_speech or len(self.tokens) >= self.max_tokens:
            self.done = True
            if value == self.t3.cfg.stop_speech:
                return None
        return value

    def all(self) -> list[int]:
        """Every remaining token."""
        out = []
        while (t := self.next()) is not None:
            out.append(t)
        return out


def load_t3(
    directory: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> T3:
    """T3 from a Chatterbox Turbo checkpoint folder (``t3_turbo_v1.safetensors``).

    Raises:
        CheckpointError: the file is missing or unreadable, or its tensors do not make a T3.
    """
    path = Path(directory) / T3_FILE
    state = read_state(path)
    cfg = T3Config.from_tensors(state)
    with torch.device("meta"):
        t3 = T3(cfg)
    state = {k: v for k, v in state.items() if k not in _UNUSED and not k.endswith(_BUFFERS)}
    check_state(t3, state, f"{path}: not a T3 state")
    state = {
        k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in state.items()
    }
    t3.load_state_dict(state, strict=True, assign=True)
    t3.eval().requires_grad_(False)
    log.info("loaded T3 from %s (%d layers, width %d)", path, cfg.layers, cfg.width)
    return t3


@torch.inference_mode()
def next_many(t3: T3, streams: list[TokenStream]) -> list[int | None]:
    """The next token of each of several :attr:`~TokenStream.steady` streams in one batched step (its
    own sampler and generator each): what ``[s.next() for s in streams]`` gives, up to the float
    rounding of the batched products (:meth:`GPT2.forward_rows`)."""
    if len(streams) == 1:
        return [streams[0].next()]
    embeds = t3.speech_emb(torch.cat([s.tokens[-1] for s in streams]))  # [B, 1, width]
    hidden = t3.tfmr.forward_rows(embeds, [s.cache for s in streams])
    logits = t3.logits(hidden[:, -1])
    return [s._take(logits[i : i + 1], torch.cat(s.tokens, dim=1)) for i, s in enumerate(streams)]
