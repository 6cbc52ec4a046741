"""The pieces a stream is spoken in: its text planned, each piece's generator, and the next one's prefill.

A long text is spoken in sentence-cut pieces of at most ``piece_chars`` (a text that arrives in
sentences, for a layout that needs whole text, in its sentences' pieces). Each piece gets its own
generator and derived frame limit (the runaway guard), with the stream's decoder, voice and seed;
while one piece plays, the next one's prefill runs in parts between frames (:meth:`Pieces.look_ahead`,
:meth:`Pieces.prefill_ahead`), and when it ends the stream switches to the next without a seam
(:meth:`Pieces.next_piece`).

Kept apart from the frame loop: it builds and prefills generators for the scheduler, which decides
when (it calls :meth:`Pieces.prefill_ahead` in a round with no admission prefill waiting).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from voxcast.engine.active import Active, log_extra
from voxcast.engine.config import EngineConfig, max_frames_for_text
from voxcast.engine.model_info import ModelInfo
from voxcast.engine.stream import SynthesisStream
from voxcast.models.base import FrameGenerator, TTSModel
from voxcast.text.split import plan_chunks

__all__ = ["Pieces"]

log = logging.getLogger(__name__)


class Pieces:
    """Builds admitted streams and their pieces' generators; queues next pieces' prefills.

    Args:
        config: the engine's settings (``piece_chars``, ``prefill_chunk``, frame limits).
        info: the model's constants (its frame rate, for the derived frame limit).
        model: the loaded model.
    """

    def __init__(self, config: EngineConfig, info: ModelInfo, model: Callable[[], TTSModel]) -> None:
        self._config = config
        self._info = info
        self._model = model
        self._ahead: list[Active] = []  # active long texts whose next piece is prefilled between frames

    def queued(self) -> bool:
        """Whether a next piece waits to be prefilled ahead."""
        return bool(self._ahead)

    def plan(self, text: str) -> list[str]:
        """The pieces a text is spoken in: itself, or sentence-cut pieces of at most ``piece_chars``."""
        limit = self._config.piece_chars
        if not limit or len(text) <= limit:
            return [text]
        return plan_chunks(text, limit) or [text]

    def frame_limit(self, text: str) -> int:
        """The derived frame limit of ``text`` (the runaway guard), in the model's frames: the rule is
        written for 12.5 frames a second (Qwen3-TTS) and scaled for other rates (Chatterbox Turbo: 25)."""
        scale = self._info.sample_rate / self._info.samples_per_frame / 12.5
        return max(2, round(max_frames_for_text(text, self._config.max_frames_cap) * scale))

    def start(self, stream: SynthesisStream, prefill: bool = True, pieces: list[str] | None = None) -> Active:
        """An admitted stream: its text planned into pieces (or the given ``pieces`` of a text that
        arrives in sentences), the first one's generator built and, with ``prefill``, prefilled."""
        req, timing = stream.request, stream.timing
        t0 = time.perf_counter()
        if pieces is None:
            timing.queue_wait_ms = (t0 - stream.t_submit) * 1000
            pieces = self.plan(req.text)
        several = len(pieces) > 1 or stream.feed is not None
        timing.pieces = len(pieces)
        gen, max_frames = self._piece_generator(stream, pieces[0], req.sampling, 0, several)
        timing.prompt_ms = (time.perf_counter() - t0) * 1000
        decoder = self._model().new_decoder(stream.voice, seed=gen.seed)
        if gen.seed is not None:
            timing.extra["seed"] = int(gen.seed)
        first = req.first_chunk_frames or self._config.first_chunk_frames
        act = Active(stream, gen, decoder, max_frames, target=first, first=first, pieces=pieces[1:])
        if several:
            act.piece_log.append({"chars": len(pieces[0]), "first_frame": 0})
        if prefill:
            gen.prefill()
            self.prefilled(act)
        return act

    def _piece_generator(
        self, stream: SynthesisStream, text: str, sampling: Any, frames_so_far: int, several: bool
    ) -> tuple[FrameGenerator, int]:
        """A generator for ``text`` (the stream's text, or one of its ``several`` pieces) and its
        frame limit: the caller's ``max_frames`` for a whole text; for a piece, its own derived limit
        (the runaway guard) within what the caller's ``max_frames`` leaves for the whole text."""
        req = stream.request
        model = self._model()
        prompt = model.build_prompt(
            text,
            speaker=req.voice if stream.voice is None else None,
            voice=stream.voice,
            language=req.language,
            instruct=req.instruct,
            non_streaming_text=req.non_streaming_text,
        )
        limit = self.frame_limit(text)
        if req.max_frames is not None:
            left = req.max_frames - frames_so_far
            limit = min(limit, left) if several else left
        return model.new_generator(prompt, sampling, limit), limit

    def prefilled(self, act: Active) -> None:
        """Record a completed prefill in the request's timing; queue the next piece's prefill."""
        t, gen = act.stream.timing, act.generator
        t.prefill_ms = gen.prefill_s * 1000
        t.prefill_parts = max(1, t.prefill_parts)
        prefix = gen.prefix_report()
        if prefix is not None:
            t.prefix_cache_hit, t.prefix_positions = prefix
        self.look_ahead(act)

    # -- the next piece --------------------------------------------------------------------------
    def look_ahead(self, act: Active) -> None:
        """Queue the prefill of ``act``'s next piece, run in parts between frames (:meth:`prefill_ahead`).

        Not where the caller set ``max_frames``: the next piece's limit is what the current one
        leaves, known only when it ends (the next piece is then prefilled at the switch).
        """
        if not act.pieces or act.ahead is not None or act.stream.request.max_frames is not None:
            return
        act.ahead, act.ahead_frames = self._next_generator(act)
        act.ahead_ready = False
        self._ahead.append(act)

    def _next_generator(self, act: Active) -> tuple[FrameGenerator, int]:
        return self._piece_generator(act.stream, act.pieces[0], self._piece_sampling(act), act.frames, True)

    @staticmethod
    def _piece_sampling(act: Active) -> Any:
        """One sampler and seed for every piece: the first piece's seed (drawn, when none was asked)."""
        seed = act.stream.timing.extra.get("seed")
        return act.stream.request.sampling.model_copy(update={"seed": seed})

    def prefill_ahead(self, active: list[Active]) -> None:
        """One part of the oldest queued next-piece prefill (dropped for a stream not in ``active``);
        a failure fails that stream alone and takes it out of ``active``."""
        act = self._ahead[0]
        if act.failed or act.stream.cancelled or act not in active or act.ahead is None:
            self._ahead.pop(0)
            return
        try:
            done = act.ahead.prefill_part(self._config.prefill_chunk or None)
        except Exception as e:
            self._ahead.pop(0)
            log.exception(
                "request %s failed to prefill its next piece",
                act.stream.timing.request_id,
                extra=log_extra(act),
            )
            if act in active:
                active.remove(act)
            act.fail(e)
            return
        if done:
            act.ahead_ready = True
            self._ahead.pop(0)

    def next_piece(self, act: Active) -> bool:
        """Continue ``act`` with its next piece after the current one ended; False when there is none
        (or the caller's ``max_frames`` is spent). Same stream, decoder, voice and seed; the pending
        frames carry over into the next chunk, so the audio runs on without a seam."""
        req = act.stream.request
        if not act.pieces or (req.max_frames is not None and act.frames >= req.max_frames):
            return False
        old = act.generator
        act.close_piece(old.finish_reason or "eos")
        for k, v in old.stage_ms().items():
            act.stage_totals[k] = act.stage_totals.get(k, 0.0) + v
        if act.ahead is None:
            act.ahead, act.ahead_frames = self._next_generator(act)
        gen, ahead = act.ahead, act.ahead_ready
        if act in self._ahead:
            self._ahead.remove(act)
        if not ahead:
            gen.prefill_part(None)  # the rest of it (or all of it)
        text = act.pieces.pop(0)
        act.generator, act.max_frames = gen, act.ahead_frames
        act.ahead, act.ahead_ready = None, False
        act.piece_log.append(
            {
                "chars": len(text),
                "first_frame": act.frames,
                "prefill_ms": gen.prefill_s * 1000,
                "ahead": ahead,
            }
        )
        self.look_ahead(act)
        return True
