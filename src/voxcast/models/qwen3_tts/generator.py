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

import torch
from torch import Tensor

from voxcast.models.qwen3_tts.prompt import Prompt
from voxcast.models.qwen3_tts.sampling import CodeSampler, SamplerSettings, TalkerSampler, make_generator
from voxcast.models.qwen3_tts.talker import Talker

__all__ = ["FrameGenerator"]

logger = logging.getLogger(__name__)


class FrameGenerator:
    """Generates the frames of one prompt. Call :meth:`prefill` once, then :meth:`step` until None.

    Attributes:
        frames: frames emitted so far.
        finish_reason: None while running, then "eos" or "max_frames".
        seed: the seed of this stream's random generator (drawn at random when none was given).
        prefill_s, talker_s, code_predictor_s: cumulative wall time of each part (seconds).
    """

    def __init__(
        self,
        talker: Talker,
        prompt: Prompt,
        settings: SamplerSettings,
        max_frames: int,
        seed: int | None = None,
    ) -> None:
        if max_frames < 0:
            raise ValueError("max_frames must be >= 0")
        self.talker = talker
        self.prompt = prompt
        self.max_frames = max_frames
        device = talker.codec_head.weight.device
        gen, self.seed = make_generator(seed, device)
        cfg = talker.cfg
        self._talker_pick = TalkerSampler(
            cfg.vocab_size, cfg.codec_eos_token_id, settings, gen, device=device
        )
        self._code_pick = CodeSampler(settings, gen)
        self._eos = cfg.codec_eos_token_id
        self._cache = talker.new_cache(prompt.length + max(max_frames, 1))
        self._cp_cache = talker.code_predictor.new_cache()
        self._pos = 0
        self._hidden: Tensor | None = None  # [1, 1, H] last talker output
        self._code0: Tensor | None = None  # [1] next frame's code 0
        self._pending: Tensor | None = None  # [1, 1, H] E(last emitted frame)
        self.frames = 0
        self.finish_reason: str | None = None
        self.prefill_s = 0.0
        self.talker_s = 0.0
        self.code_predictor_s = 0.0

    @property
    def done(self) -> bool:
        """Whether generation has finished."""
        return self.finish_reason is not None

    @torch.inference_mode()
    def prefill(self) -> None:
        """Run the prompt through the talker and draw the first frame's code 0."""
        if self._code0 is not None:
            raise RuntimeError("prefill() was already called")
        t0 = time.perf_counter()
        hidden, logits = self.talker(self.prompt.embeds, self._cache, 0)
        self._pos = self.prompt.length
        self._hidden = hidden[:, -1:]
        self._code0 = self._talker_pick(logits[:, -1, :].to(torch.float32))
        self.prefill_s += time.perf_counter() - t0

    @torch.inference_mode()
    def step(self) -> Tensor | None:
        """The next frame's codes (LongTensor ``[16]``), or None once finished (see ``finish_reason``)."""
        if self.finish_reason is not None:
            return None
        if self._code0 is None:
            self.prefill()
        if self.frames >= self.max_frames:
            self._finish("max_frames")
            return None
        if self._pending is not None:
            self._talker_step()
        assert self._code0 is not None and self._hidden is not None
        if bool((self._code0 == self._eos).item()):  # the one host sync per frame
            self._finish("eos")
            return None
        t0 = time.perf_counter()
        cp = self.talker.code_predictor
        code0_embed = self.talker.codec_embed(self._code0[:, None])  # [1, 1, H]
        codes = cp.predict(self._hidden, code0_embed, self._cp_cache, self._code_pick)  # [1, 15]
        self._pending = cp.frame_embed(code0_embed, codes)
        frame = torch.cat((self._code0[:, None], codes), dim=1)[0]  # [16]
        self.code_predictor_s += time.perf_counter() - t0
        self.frames += 1
        return frame

    def _talker_step(self) -> None:
        t0 = time.perf_counter()
        assert self._pending is not None
        s = self.frames - 1  # decode step index: which trailing-text position to add
        trailing = self.prompt.trailing
        text = trailing[:, s : s + 1] if s < trailing.shape[1] else self.prompt.pad
        hidden, logits = self.talker(self._pending + text, self._cache, self._pos)
        self._pos += 1
        self._hidden = hidden[:, -1:]
        self._code0 = self._talker_pick(logits[:, -1, :].to(torch.float32))
        self._pending = None
        self.talker_s += time.perf_counter() - t0

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        self._cache = []
        logger.debug("generation finished: %s after %d frames", reason, self.frames)
