"""Frame-by-frame generation: one call to :meth:`FrameGenerator.step` yields one 16-code frame.

Per frame (docs/qwen3-tts.md, "One decode step"): the talker's last output and ``C(code0)`` go
through the code predictor (codes 1..15, fresh cache) and the frame is returned at once, so the
codec can decode it while the caller wants; the talker step that produces the next frame's code 0
runs at the start of the next :meth:`~FrameGenerator.step`. Random draws happen in the official
order (1 talker draw, then 15 code-predictor draws per frame).

Limits: ``max_frames`` is the number of frames emitted at most (the official ``max_new_tokens = N``
allows ``N - 1`` frames). End of speech is code 0 == ``codec_eos_token_id``; it is blocked for the
first two samples, as in the official generation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
from torch import Tensor

from voxcast.models.qwen3_tts.open_prompt import OpenPrompt
from voxcast.models.qwen3_tts.prefix_cache import PrefixKVCache
from voxcast.models.qwen3_tts.prompt import Prompt
from voxcast.models.qwen3_tts.sampling import CodeSampler, SamplerSettings, TalkerSampler, make_generator
from voxcast.models.qwen3_tts.talker import Talker

__all__ = ["FrameGenerator", "step_many"]

logger = logging.getLogger(__name__)

#: Frames the talker's key/value cache has room for at first (10.24 s of audio); longer streams
#: grow it by doubling (see kv_cache.KVCache), so memory follows the frames generated, not the limit.
KV_RESERVE_FRAMES = 128


class FrameGenerator:
    """Generates the frames of one prompt. Call :meth:`prefill` once, then :meth:`step` until None.

    Attributes:
        frames: frames emitted so far.
        finish_reason: None while running, then "eos" or "max_frames".
        seed: the seed of this stream's random generator (drawn at random when none was given).
        prefill_s, talker_s, code_predictor_s: cumulative wall time of each part (seconds).
        prefix_hit: whether the prefill reused cached prefix keys/values (see :mod:`.prefix_cache`).
        prefix_positions: prompt positions the prefill skipped thanks to that (0 on a miss).
    """

    def __init__(
        self,
        talker: Talker,
        prompt: Prompt | OpenPrompt,
        settings: SamplerSettings,
        max_frames: int,
        seed: int | None = None,
        prefix_cache: PrefixKVCache | None = None,
    ) -> None:
        if max_frames < 0:
            raise ValueError("max_frames must be >= 0")
        self.talker = talker
        self.prompt = prompt
        self.max_frames = max_frames
        self._prefix_cache = prefix_cache
        device = talker.codec_head.weight.device
        gen, self.seed = make_generator(seed, device)
        cfg = talker.cfg
        self._talker_pick = TalkerSampler(
            cfg.vocab_size, cfg.codec_eos_token_id, settings, gen, device=device
        )
        self._code_pick = CodeSampler(settings, gen)
        self._eos = cfg.codec_eos_token_id
        self._cache = talker.new_cache(
            prompt.length + max(max_frames, 1), reserve=prompt.length + KV_RESERVE_FRAMES
        )
        self._pos = 0
        self._hidden: Tensor | None = None  # [1, 1, H] last talker output
        self._code0: Tensor | None = None  # [1] next frame's code 0
        self._pending: Tensor | None = None  # [1, 1, H] E(last emitted frame)
        self.frames = 0
        self.finish_reason: str | None = None
        self.prefill_s = 0.0
        self.talker_s = 0.0
        self.code_predictor_s = 0.0
        self.prefix_hit = False
        self.prefix_positions = 0
        self._filled = 0  # prompt positions in the cache so far

    @property
    def done(self) -> bool:
        """Whether generation has finished."""
        return self.finish_reason is not None

    @property
    def prefilled(self) -> bool:
        """Whether the prefill is complete (the first frame's code 0 is drawn)."""
        return self._code0 is not None

    def stage_ms(self) -> dict[str, float]:
        """Cumulative wall time of the talker and the code predictor (the engine's timing record)."""
        return {"talker_ms": self.talker_s * 1000, "code_predictor_ms": self.code_predictor_s * 1000}

    def prefix_report(self) -> tuple[bool, int] | None:
        """(prefix cache hit, positions skipped), or None when the prefix cache does not apply."""
        if self._prefix_cache is None or self.prompt.prefix_key is None:
            return None
        return self.prefix_hit, self.prefix_positions

    def prefill(self) -> None:
        """Run the prompt through the talker and draw the first frame's code 0.

        With a prefix cache: on a hit, the cached prefix keys/values are copied in and only positions
        ``[prefix_len, L)`` run; on a miss, the one-pass prefill runs and its prefix is stored.
        """
        if self._code0 is not None:
            raise RuntimeError("prefill() was already called")
        self.prefill_part(None)

    @torch.inference_mode()
    def prefill_part(self, max_positions: int | None) -> bool:
        """Run at most ``max_positions`` more prompt positions (all with None); True once complete.

        A scheduler prefilling a new request while other streams decode interleaves these parts with
        their frames, so they stall by one part instead of a whole prefill. A prefill in several
        parts equals the one-pass prefill up to float rounding (like a prefix-cache hit); one part
        covering the whole prompt is exactly :meth:`prefill`.
        """
        if self._code0 is not None:
            return True
        t0 = time.perf_counter()
        p, store = self.prompt, self._prefix_cache
        key = p.prefix_key if store is not None else None
        if (
            self._filled == 0
            and store is not None
            and key is not None
            and store.load(key, p.prefix_len, self._cache)
        ):
            self.prefix_hit, self.prefix_positions = True, p.prefix_len
            self._filled = p.prefix_len
        start = self._filled
        end = p.length if max_positions is None else min(p.length, start + max(1, max_positions))
        hidden, logits = self.talker(p.embeds[:, start:end], self._cache, start)
        self._filled = end
        if store is not None and key is not None and not self.prefix_hit and start < p.prefix_len <= end:
            store.store(key, p.prefix_len, self._cache)
        if end == p.length:
            self._pos = p.length
            self._hidden = hidden[:, -1:]
            self._code0 = self._talker_pick(logits[:, -1, :].to(torch.float32))
        self.prefill_s += time.perf_counter() - t0
        return self._code0 is not None

    def step(self) -> Tensor | None:
        """The next frame's codes (LongTensor ``[16]``), or None once finished (see ``finish_reason``)."""
        return step_many((self,))[0]

    @property
    def waiting(self) -> bool:
        """Whether the next frame needs text that has not arrived (an :class:`OpenPrompt` whose next
        token is not final yet): the stream must not step until it has."""
        if self.finish_reason is not None or self._pending is None:
            return False
        return self.prompt.text_row(self.frames - 1) is None

    def _next_text(self) -> Tensor:
        # [1, 1, H]: the text-track input of decode step `frames - 1` (trailing text, then pad)
        row = self.prompt.text_row(self.frames - 1)
        if row is None:
            raise RuntimeError("a stream waiting for text was stepped")
        return row

    def _ready(self) -> bool:
        """Prefill on demand and apply the frame limit; True when a talker step or frame may follow."""
        if self.finish_reason is not None:
            return False
        if self._code0 is None:
            self.prefill()
        if self.frames >= self.max_frames:
            self._finish("max_frames")
            return False
        return True

    def _take_talker(self, hidden: Tensor, logits: Tensor) -> None:
        # hidden: [1, 1, H]; logits: [1, V] of this stream's talker step
        self._pos += 1
        self._hidden = hidden
        self._code0 = self._talker_pick(logits if logits.dtype == torch.float32 else logits.float())
        self._pending = None

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        self._cache = []
        logger.debug("generation finished: %s after %d frames", reason, self.frames)


@torch.inference_mode()
def step_many(gens: Sequence[FrameGenerator]) -> list[Tensor | None]:
    """Advance several generators of one model by one frame each, batched (continuous batching).

    Each generator keeps its own KV cache, position, sampler state and random generator; the talker
    step runs as one batched forward over the rows that need it (per-row positions and caches),
    and the code predictor as one batched forward per intra-frame step (all rows are at the same
    step). Generators that need a prefill get it first, alone. With one generator this is exactly
    :meth:`FrameGenerator.step`; with several, a row's values can differ from single-stream decoding
    in the last bits (batched matmuls accumulate in another order), so codes agree except near ties.

    Returns:
        Per generator: the frame's codes (LongTensor ``[16]``), or None when it is finished.
    """
    live = [g for g in gens if g._ready()]
    if not live:
        return [None] * len(gens)
    talker = live[0].talker
    stepping = [g for g in live if g._pending is not None]
    if stepping:
        t0 = time.perf_counter()
        _talker_rows(talker, stepping)
        dt = time.perf_counter() - t0
        for g in stepping:
            g.talker_s += dt
    rows = []
    for g in live:
        assert g._code0 is not None
        if bool((g._code0 == g._eos).item()):  # the one host sync per frame and stream
            g._finish("eos")
        else:
            rows.append(g)
    out: dict[int, Tensor] = {}
    if rows:
        t0 = time.perf_counter()
        if len(rows) == 1:
            code0, hidden = _t(rows[0]._code0), _t(rows[0]._hidden)  # [1], [1, 1, H]
        else:
            code0 = torch.cat([_t(g._code0) for g in rows])  # [B]
            hidden = torch.cat([_t(g._hidden) for g in rows])  # [B, 1, H]
        code0_embed = talker.codec_embed(code0[:, None])  # [B, 1, H]
        picks = rows[0]._code_pick if len(rows) == 1 else [g._code_pick for g in rows]
        codes, frame_embed = talker.code_predictor.predict_frame(hidden, code0_embed, picks)  # [B, 15]
        frames = torch.cat((code0[:, None], codes), dim=1)  # [B, 16]
        dt = time.perf_counter() - t0
        for i, g in enumerate(rows):
            g._pending = frame_embed[i : i + 1]
            g.code_predictor_s += dt
            g.frames += 1
            out[id(g)] = frames[i]
    return [out.get(id(g)) for g in gens]


def _t(x: Tensor | None) -> Tensor:
    assert x is not None
    return x


def _talker_rows(talker: Talker, rows: list[FrameGenerator]) -> None:
    """The talker step of every row: E(last frame) + next text position, at each row's position."""
    embeds = [_t(g._pending) + g._next_text() for g in rows]  # [1, 1, H] each
    if len(rows) == 1:
        g = rows[0]
        hidden, logits = talker(embeds[0], g._cache, g._pos)
        g._take_talker(hidden[:, -1:], logits[:, -1, :])
        return
    hidden, logits = talker.forward_rows(torch.cat(embeds), [g._cache for g in rows], [g._pos for g in rows])
    for i, g in enumerate(rows):
        g._take_talker(hidden[i : i + 1], logits[i : i + 1, -1, :])
