"""Prefill layouts for every mode, and the checks that a request fits the model.

Every prompt position is the sum of a text-track embedding ``T(x) = text_projection(text_embedding(x))``
and a codec-track embedding ``C(x)`` (see docs/qwen3-tts.md, "Prompt (prefill) layout")::

    [T(instruct template)]                      instruct (VoiceDesign, CustomVoice 1.7B)
    T(<|im_start|>) T(assistant) T(\\n)           role
    T(pad)+C(think|nothink) T(pad)+C(think_bos) [T(pad)+C(lang)] T(pad)+C(think_eos)
    [T(pad)+speaker]                            C(spk id) | raw x-vector
    T(tts_bos)+C(pad)
    then one of
      streaming text:     T(text[0])+C(bos)                 trailing = T(text[1:]) T(eod)
      non-streaming text: T(text[i])+C(pad)... T(eod)+C(pad) T(pad)+C(bos)     trailing = T(pad)
      ICL clone:          T(ref_text ++ text ++ eod) aligned with C(bos) E(ref frame 1..N)

Tensors are computed in the same pieces as the official implementation (same rows per projection
call), so the prefill is bitwise equal to the official one, with one exception: the text a
streaming-text layout feeds after the prefill (and an ICL clone's text track) is projected in fixed
blocks of :data:`TEXT_BLOCK` rows, so that text arriving in pieces (:mod:`.open_prompt`) gets the
same rows as the whole text; that equals the official single call wherever the BLAS computes a row
the same for every row count (MKL on AVX-512: for calls of 12 rows and more). The part that depends only on the voice
and language (role, tags, speaker slot) and the reference-frame embeddings of a cloned voice are
cached per voice.

Each prompt also names its constant leading positions for the prefix KV cache
(:mod:`.prefix_cache`): ``prefix_len`` positions (instruct block, role, tags, speaker slot,
``T(tts_bos)+C(pad)``, and for an ICL voice the positions whose text track is reference text)
and ``prefix_key``, a digest of everything those positions are computed from.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from voxcast.errors import InvalidRequest
from voxcast.models.qwen3_tts.config import Qwen3TTSConfig
from voxcast.models.qwen3_tts.talker import Talker
from voxcast.models.qwen3_tts.tokenizer import TextTokenizer

__all__ = ["TEXT_BLOCK", "OpenHead", "Prompt", "PromptBuilder", "VoiceLike"]

logger = logging.getLogger(__name__)

#: Per-voice prefix entries kept in memory.
PREFIX_CACHE_SIZE = 64

#: Rows per text-embedding call for the text that streaming-text layouts feed after the prefill
#: (see :meth:`PromptBuilder.text_rows`).
TEXT_BLOCK = 16


class VoiceLike(Protocol):
    """What a prompt needs from a cloned voice (:class:`~.voice_prompt.VoicePrompt`)."""

    @property
    def x_vector(self) -> Tensor: ...  # [D] float

    @property
    def ref_codes(self) -> Tensor | None: ...  # [N, 16] int64, None for x-vector-only voices

    @property
    def ref_text(self) -> str | None: ...


@dataclass(frozen=True)
class Prompt:
    """A ready prefill: ``embeds [1, L, H]`` plus the text fed one position per frame afterwards."""

    embeds: Tensor
    #: ``[1, T, H]`` added to the talker input of decode steps 0..T-1; ``pad`` afterwards.
    trailing: Tensor
    #: ``[1, 1, H]`` = ``T(<tts_pad>)``.
    pad: Tensor
    #: "custom_voice", "voice_design", "clone_icl" or "clone_xvector".
    mode: str
    #: Tokens of the target text (what the frame budget is derived from).
    text_tokens: int
    #: The cloned voice (ICL: its reference codes prime the codec decoder), else None.
    voice: VoiceLike | None = None
    #: Leading positions that depend only on model, voice, speaker, language, instruct (and for an
    #: ICL voice the text mode), never on the text; always < :attr:`length`. 0: nothing cacheable.
    prefix_len: int = 0
    #: Digest naming those positions' inputs and the model (identity, dtype, quant, device); None
    #: when ``prefix_len`` is 0.
    prefix_key: str | None = None

    @property
    def length(self) -> int:
        """Prefill positions."""
        return int(self.embeds.shape[1])

    def text_row(self, step: int) -> Tensor:
        """``[1, 1, H]``: the text-track input of decode step ``step`` (trailing text, then pad)."""
        trailing = self.trailing
        return trailing[:, step : step + 1] if step < trailing.shape[1] else self.pad


@dataclass(frozen=True)
class OpenHead:
    """What an open prompt's prefill holds before its text: built by :meth:`PromptBuilder.open`.

    Attributes:
        head: ``[1, n, H]`` instruct block, role, tags, speaker slot and ``T(tts_bos)+C(pad)``.
        codec: ``[1, k, H]`` the codec track under the text positions of the prefill: ``C(bos)``
            (k = 1), or for an ICL clone ``C(bos), E(ref frames)``.
        lead: token ids ahead of the target text on the text track (an ICL clone's reference text).
        eos, pad: ``T(tts_eod)``, ``T(tts_pad)``.
    """

    head: Tensor
    codec: Tensor
    lead: list[int]
    eos: Tensor
    pad: Tensor
    mode: str
    voice: VoiceLike | None
    prefix_len: int
    prefix_key: str | None

    @property
    def icl(self) -> bool:
        return self.mode == "clone_icl"


def _target_template(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def _ref_template(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def _instruct_template(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n"


class PromptBuilder:
    """Builds :class:`Prompt` objects for one loaded model. Thread-safe: one lock around :meth:`build`
    (the scheduler builds prompts while voices are prepared on other threads).

    Args:
        cache_scope: names the model in every ``prefix_key`` (identity, dtype, quant, device).
    """

    def __init__(
        self, config: Qwen3TTSConfig, talker: Talker, tokenizer: TextTokenizer, *, cache_scope: str = ""
    ) -> None:
        self.config = config
        self.cache_scope = cache_scope
        self.talker = talker
        self.tokenizer = tokenizer
        self._prefix: OrderedDict[tuple[object, ...], tuple[VoiceLike | None, Tensor]] = OrderedDict()
        self._ref: OrderedDict[int, tuple[VoiceLike, Tensor]] = OrderedDict()
        self._specials: tuple[Tensor, Tensor, Tensor] | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ validation

    def validate(
        self, text: str, *, speaker: str | None, voice: VoiceLike | None, language: str, instruct: str | None
    ) -> tuple[str, str | None]:
        """Check a request against the model; returns ``(language, speaker)`` normalised.

        Raises:
            InvalidRequest: with ``field`` "text", "language", "voice", "ref_audio" or "instruct".
        """
        cfg, kind = self.config, self.config.tts_model_type
        if not text or not text.strip():
            raise InvalidRequest("text is empty", field="text")
        lang = (language or "auto").strip().lower()
        if lang not in cfg.languages:
            raise InvalidRequest(
                f"unknown language {language!r}; known: {', '.join(cfg.languages)}", field="language"
            )
        spk = speaker.strip().lower() if speaker and speaker.strip() else None
        if kind == "custom_voice":
            if voice is not None:
                raise InvalidRequest("this CustomVoice model cannot clone reference audio", field="ref_audio")
            if spk is None:
                raise InvalidRequest(f"choose a speaker: {', '.join(cfg.speakers)}", field="voice")
            if spk not in cfg.talker.spk_id:
                raise InvalidRequest(
                    f"unknown speaker {speaker!r}; known: {', '.join(cfg.speakers)}", field="voice"
                )
        elif spk is not None:
            raise InvalidRequest(f"a {kind} model has no named speakers", field="voice")
        if kind == "base" and voice is None:
            raise InvalidRequest("a Base model clones a voice: give reference audio", field="ref_audio")
        if kind == "voice_design":
            if voice is not None:
                raise InvalidRequest("a VoiceDesign model cannot clone reference audio", field="ref_audio")
            if not instruct or not instruct.strip():
                raise InvalidRequest(
                    "a VoiceDesign model needs an instruct text describing the voice", field="instruct"
                )
        if instruct and instruct.strip() and not cfg.supports_instruct:
            # The official wrapper silently drops instruct on 0.6B CustomVoice; we refuse it.
            raise InvalidRequest(
                f"this {cfg.tts_model_size or kind} {kind} model does not take instruct", field="instruct"
            )
        if voice is not None and voice.ref_codes is not None and not (voice.ref_text or "").strip():
            raise InvalidRequest("an ICL voice needs its reference text", field="ref_text")
        return lang, spk

    # ------------------------------------------------------------------ building

    def build(
        self,
        text: str,
        *,
        speaker: str | None = None,
        voice: VoiceLike | None = None,
        language: str = "auto",
        instruct: str | None = None,
        non_streaming_text: bool | None = None,
    ) -> Prompt:
        """Build the prefill for one request (see the module docstring for the layout).

        Args:
            text: text to speak.
            speaker: a named speaker (CustomVoice).
            voice: a cloned voice (Base); ICL when it has reference codes, x-vector-only otherwise.
            language: "auto" or a language of :attr:`Qwen3TTSConfig.languages`.
            instruct: style/voice description (VoiceDesign; CustomVoice 1.7B).
            non_streaming_text: whole text in the prefill. Default as the official wrapper: False
                for cloning, True otherwise.

        Raises:
            InvalidRequest: the request does not fit the model (see :meth:`validate`).
        """
        lang, spk = self.validate(text, speaker=speaker, voice=voice, language=language, instruct=instruct)
        if non_streaming_text is None:
            non_streaming_text = voice is None
        with self._lock, torch.inference_mode():
            return self._build(text, spk, voice, lang, instruct, non_streaming_text)

    def _build(
        self,
        text: str,
        spk: str | None,
        voice: VoiceLike | None,
        lang: str,
        instruct: str | None,
        non_streaming: bool,
    ) -> Prompt:
        ids = self._ids(_target_template(text))  # [1, n]
        if ids.shape[1] < 9:
            raise InvalidRequest("text produced no tokens", field="text")
        _, eos, pad = self._special_embeds()
        parts, n_const, key = self._head(ids, spk, voice, lang, instruct)
        if voice is not None and voice.ref_codes is not None:
            ref_ids = self._ref_ids(voice)
            icl, trailing = self._icl(ids, ref_ids, voice, pad, eos, non_streaming)
            parts.append(icl)
            n_ref = ref_ids.shape[1]  # positions whose text track is reference text
            n_const += n_ref if non_streaming else min(n_ref, voice.ref_codes.shape[0] + 1)
            key += [ref_ids, voice.ref_codes, non_streaming]
            mode = "clone_icl"
        else:
            block, trailing = self._text_block(ids, pad, eos, non_streaming)
            parts.append(block)
            mode = "clone_xvector" if voice is not None else self.config.tts_model_type
        embeds = torch.cat(parts, dim=1)
        prefix_len = min(n_const, embeds.shape[1] - 1)  # at least one position left to prefill
        prefix_key = _digest(*key, prefix_len) if prefix_len > 0 else None
        return Prompt(
            embeds,
            trailing,
            pad,
            mode,
            int(ids.shape[1]) - 8,
            voice,
            prefix_len=prefix_len,
            prefix_key=prefix_key,
        )

    def open(
        self, *, speaker: str | None, voice: VoiceLike | None, language: str, instruct: str | None
    ) -> OpenHead:
        """The part of a streaming-text prompt that comes before its text (:mod:`.open_prompt`):
        the same positions, prefix length and prefix key as :meth:`build` gives any text.

        Raises:
            InvalidRequest: the request does not fit the model (see :meth:`validate`).
        """
        lang, spk = self.validate("-", speaker=speaker, voice=voice, language=language, instruct=instruct)
        with self._lock, torch.inference_mode():
            _, eos, pad = self._special_embeds()
            parts, n_const, key = self._head(self._ids(_target_template("")), spk, voice, lang, instruct)
            lead: list[int] = []
            if voice is not None and voice.ref_codes is not None:
                ref_ids = self._ref_ids(voice)
                codec = self._ref_codec_embeds(voice)
                n_const += min(ref_ids.shape[1], voice.ref_codes.shape[0] + 1)
                key += [ref_ids, voice.ref_codes, False]
                lead = [int(i) for i in ref_ids[0].tolist()]
                mode = "clone_icl"
            else:
                codec = self._codec([[self.config.talker.codec_bos_id]])
                mode = "clone_xvector" if voice is not None else self.config.tts_model_type
            head = torch.cat(parts, dim=1)
            prefix_len = min(n_const, head.shape[1] + codec.shape[1] - 1)
            prefix_key = _digest(*key, prefix_len) if prefix_len > 0 else None
        return OpenHead(head, codec, lead, eos, pad, mode, voice, prefix_len, prefix_key)

    def _head(
        self, ids: Tensor, spk: str | None, voice: VoiceLike | None, lang: str, instruct: str | None
    ) -> tuple[list[Tensor], int, list[object]]:
        """The positions before the text (instruct block, role, tags, speaker slot,
        ``T(tts_bos)+C(pad)``), their count and what they are computed from (the prefix key's
        parts). ``ids``: the target template's tokens (its first three are the role)."""
        lang_id = self._language_id(lang, spk)
        prefix = self._prefix_embeds(ids, spk, voice, lang_id)
        parts = []
        instruct_ids = self._ids(_instruct_template(instruct)) if instruct and instruct.strip() else None
        if instruct_ids is not None:
            parts.append(self.talker.text_embed(instruct_ids))
        parts.append(prefix)
        x_vector = voice.x_vector if voice is not None else None
        key: list[object] = [self.cache_scope, instruct_ids, ids[:, :3], spk, lang_id, x_vector]
        return parts, sum(p.shape[1] for p in parts), key

    def _ref_ids(self, voice: VoiceLike) -> Tensor:
        """An ICL voice's reference text as the text track holds it."""
        return self._ids(_ref_template(voice.ref_text or ""))[:, 3:-2]

    def text_ids(self, text: str) -> list[int]:
        """The tokens of ``text`` as a prompt holds them (inside the chat template)."""
        return [int(i) for i in self._ids(_target_template(text))[0, 3:-5].tolist()]

    def _text_block(
        self, ids: Tensor, pad: Tensor, eos: Tensor, non_streaming: bool
    ) -> tuple[Tensor, Tensor]:
        """The text positions of a non-ICL prompt and its trailing text (see the module docstring)."""
        last_codec = self._codec([[self.config.talker.codec_bos_id]])
        if non_streaming:
            body = ids[:, 3:-5]
            codec_pad = self._codec([[self.config.talker.codec_pad_id] * (body.shape[1] + 1)])
            text = torch.cat((self.talker.text_embed(body), eos), dim=1) + codec_pad
            return torch.cat((text, pad + last_codec), dim=1), pad
        trailing = torch.cat((self.text_rows(ids[:, 4:-5]), eos), dim=1)
        return self.talker.text_embed(ids[:, 3:4]) + last_codec, trailing

    def text_rows(self, ids: Tensor) -> Tensor:
        """``T(ids)`` for ``ids [1, n]`` in calls of exactly :data:`TEXT_BLOCK` rows (the last one
        padded), aligned from ``ids[0]``: ``[1, n, H]``.

        A matrix product's rows are not bitwise the same for every row count (BLAS kernels differ by
        shape: with MKL on AVX-512 the rows of calls under 12 rows differ in the last bits from larger
        calls), so text that arrives in pieces could not reproduce one call over the whole text. In
        fixed, aligned blocks a row's value depends only on its token and position, whatever was known
        when it was computed (:mod:`.open_prompt`). Where the BLAS gives every row count the same rows
        (here: 12 rows and more), this equals the official single call.
        """
        n = int(ids.shape[1])
        padded = torch.nn.functional.pad(ids, (0, (-n) % TEXT_BLOCK))
        blocks = [
            self.text_block(padded[:, i : i + TEXT_BLOCK]) for i in range(0, padded.shape[1], TEXT_BLOCK)
        ]
        if not blocks:
            return self.talker.text_embed(ids)
        return torch.cat(blocks, dim=1)[:, :n]

    def text_block(self, ids: Tensor) -> Tensor:
        """``T(ids)`` of one block of exactly :data:`TEXT_BLOCK` tokens ``[1, TEXT_BLOCK]``."""
        assert ids.shape[1] == TEXT_BLOCK, "text blocks have a fixed size"
        return self.talker.text_embed(ids)

    def _device(self) -> torch.device:
        return self.talker.codec_head.weight.device

    def _ids(self, s: str) -> Tensor:
        return torch.tensor([self.tokenizer.encode(s)], dtype=torch.long, device=self._device())

    def _codec(self, ids: list[list[int]]) -> Tensor:
        return self.talker.codec_embed(torch.tensor(ids, dtype=torch.long, device=self._device()))

    def _special_embeds(self) -> tuple[Tensor, Tensor, Tensor]:
        """``T(tts_bos), T(tts_eod), T(tts_pad)``, each ``[1, 1, H]`` (one 3-row projection)."""
        if self._specials is None:
            c = self.config
            row = torch.tensor(
                [[c.tts_bos_token_id, c.tts_eos_token_id, c.tts_pad_token_id]], device=self._device()
            )
            bos, eos, pad = self.talker.text_embed(row).chunk(3, dim=1)
            self._specials = (bos, eos, pad)
        return self._specials

    def _language_id(self, lang: str, spk: str | None) -> int | None:
        t = self.config.talker
        lang_id = None if lang == "auto" else t.codec_language_id[lang]
        dialect = t.spk_is_dialect.get(spk) if spk is not None else None
        if dialect is not None and lang in ("chinese", "auto"):
            lang_id = t.codec_language_id[dialect]
        return lang_id

    def _prefix_embeds(
        self, ids: Tensor, spk: str | None, voice: VoiceLike | None, lang_id: int | None
    ) -> Tensor:
        """Role + tags + speaker + ``T(tts_bos)+C(pad)``: ``[1, 3 + tags + spk + 1, H]``, cached."""
        role = tuple(int(i) for i in ids[0, :3].tolist())
        key = (role, spk, id(voice) if voice is not None else None, lang_id)
        hit = self._prefix.get(key)
        if hit is not None and hit[0] is voice:  # ids of dead objects can be reused
            self._prefix.move_to_end(key)
            return hit[1]
        t = self.config.talker
        tags = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
        if lang_id is not None:
            tags = [t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id]
        codec = [self._codec([tags])]
        if spk is not None:
            spk_t = torch.tensor(t.spk_id[spk], dtype=torch.long, device=self._device())
            codec.append(self.talker.codec_embed(spk_t).view(1, 1, -1))
        elif voice is not None:
            w = self.talker.codec_head.weight
            codec.append(voice.x_vector.to(device=w.device, dtype=w.dtype).view(1, 1, -1))
        codec.append(self._codec([[t.codec_pad_id, t.codec_bos_id]]))
        codec_all = torch.cat(codec, dim=1)
        bos, _, pad = self._special_embeds()
        text_track = torch.cat((pad.expand(-1, codec_all.shape[1] - 2, -1), bos), dim=1)
        out = torch.cat((self.talker.text_embed(ids[:, :3]), text_track + codec_all[:, :-1]), dim=1)
        self._remember(self._prefix, key, (voice, out))
        return out

    def _ref_codec_embeds(self, voice: VoiceLike) -> Tensor:
        """``C(bos), E(ref frame 1..N)``: ``[1, N + 1, H]``, cached per voice object."""
        hit = self._ref.get(id(voice))
        if hit is not None and hit[0] is voice:
            self._ref.move_to_end(id(voice))
            return hit[1]
        assert voice.ref_codes is not None
        codes = voice.ref_codes.to(device=self._device(), dtype=torch.long)  # [N, 16]
        cp_emb = self.talker.code_predictor.model.codec_embedding
        rows = [self.talker.codec_embed(codes[:, :1])]
        rows += [emb(codes[:, g : g + 1]) for g, emb in enumerate(cp_emb, 1)]
        frames = torch.cat(rows, dim=1).sum(1).unsqueeze(0)  # [1, N, H]
        out = torch.cat((self._codec([[self.config.talker.codec_bos_id]]), frames), dim=1)
        self._remember(self._ref, id(voice), (voice, out))
        return out

    def _icl(
        self, ids: Tensor, ref_ids: Tensor, voice: VoiceLike, pad: Tensor, eos: Tensor, non_streaming: bool
    ) -> tuple[Tensor, Tensor]:
        both = torch.cat((ref_ids, ids[:, 3:-5]), dim=-1)
        embed = self.talker.text_embed if non_streaming else self.text_rows
        text = torch.cat((embed(both), eos), dim=1)
        codec = self._ref_codec_embeds(voice)
        n_text, n_codec = text.shape[1], codec.shape[1]
        if non_streaming:
            body = text + self._codec([[self.config.talker.codec_pad_id] * n_text])
            return torch.cat((body, codec + pad), dim=1), pad
        if n_text > n_codec:
            return text[:, :n_codec] + codec, text[:, n_codec:]
        text = torch.cat([text] + [pad] * (n_codec - n_text), dim=1)
        return text + codec, pad

    @staticmethod
    def _remember(cache: OrderedDict[Any, Any], key: object, value: object) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > PREFIX_CACHE_SIZE:
            cache.popitem(last=False)


def _digest(*parts: object) -> str:
    """sha256 of ``parts`` (str, int, bool, None, or tensors by dtype, shape and bytes), hex."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Tensor):
            t = p.detach().to("cpu").contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(p.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        else:
            h.update(f"{type(p).__name__}:{p!r}".encode())
        h.update(b"\0")
    return h.hexdigest()
