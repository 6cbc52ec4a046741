"""Text that arrives in pieces, on the scheduler's side: fed to open prompts, or cut into sentences.

A stream opened with a :class:`~voxcast.engine.text_feed.TextFeed` (the caller's side: an LLM's
tokens pushed as they come) is admitted before its text is known. Once a round the scheduler has a
:class:`TextIntake` read every such stream's feed: new text goes to the stream's open prompt, which
says when it has enough to decide the prefill (the stream then starts, prefilled between frames);
for a layout that needs whole text, each complete sentence becomes the stream's next pieces
(:class:`~voxcast.engine.pieces.Pieces`). A stream whose next frame needs text not yet final waits,
taking no step; one that gets no text for ``text_wait_s`` has its text taken as complete.

Kept apart from the frame loop because it owns state of its own (the streams still waiting for the
text that decides their prefill) and reads nothing of a round but the streams it may start or end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from voxcast.engine.active import Active
from voxcast.engine.config import EngineConfig
from voxcast.engine.delivery import Delivery
from voxcast.engine.pieces import Pieces
from voxcast.engine.stream import SynthesisStream
from voxcast.errors import InvalidRequest
from voxcast.models.base import OpenPrompt, TTSModel
from voxcast.text.incremental import SentenceBuffer
from voxcast.text.normalize import normalize_text

__all__ = ["TextIntake"]

log = logging.getLogger(__name__)


@dataclass
class _Opening:
    """An admitted stream whose text has not yet decided its prefill (text arriving in pieces):
    an open prompt fed token by token, or (a layout that needs whole text) sentences."""

    stream: SynthesisStream
    prompt: OpenPrompt | None
    seen: int = -1
    sentences: _Sentences | None = None


class _Sentences:
    """The complete sentences of a text that arrives in pieces, for layouts that need whole text:
    each one is a piece of the stream as soon as the text after it has started (or the text closed)."""

    def __init__(self) -> None:
        self._buffer = SentenceBuffer()
        self._fed = 0

    def take(self, raw: str, closed: bool) -> list[str]:
        """The sentences of ``raw`` (the whole text so far) completed since the last call, normalised."""
        out = self._buffer.push(raw[self._fed :])
        self._fed = len(raw)
        if closed:
            out += self._buffer.flush()
        return [t for t in (normalize_text(x) for x in out) if t]


class TextIntake:
    """Feeds the text of streams that take it in pieces, and starts or ends them as it decides.

    Args:
        config: the engine's settings (``text_wait_s``, frame limits, first chunk size).
        model: the loaded model (open prompts, generators, decoders).
        pieces: builds a whole-text layout's streams and pieces.
        delivery: emits a waiting stream's last frames and ends streams.
        active: the scheduler's generating streams (a stream whose text ended is taken out).
        prefilling: the scheduler's streams prefilled between frames (a stream that starts joins).
    """

    def __init__(
        self,
        config: EngineConfig,
        model: Callable[[], TTSModel],
        pieces: Pieces,
        delivery: Delivery,
        active: list[Active],
        prefilling: list[Active],
    ) -> None:
        self._config = config
        self._model = model
        self._pieces = pieces
        self._delivery = delivery
        self._active = active
        self._prefilling = prefilling
        self._opening: list[_Opening] = []  # text in pieces: admitted, waiting for the prefill's text

    def waiting(self) -> int:
        """Admitted streams whose text has not yet decided their prefill."""
        return len(self._opening)

    def fail_all(self, err: Exception) -> None:
        """Fail the streams whose text has not yet decided their prefill (the scheduler stops)."""
        for opening in self._opening:
            opening.stream._fail(err)

    def open(self, stream: SynthesisStream) -> None:
        """Admit a stream whose text arrives in pieces: its prompt waits for the prefill's text."""
        req = stream.request
        prompt = self._model().open_prompt(
            speaker=req.voice if stream.voice is None else None,
            voice=stream.voice,
            language=req.language,
            instruct=req.instruct,
            non_streaming_text=req.non_streaming_text,
        )
        stream.timing.queue_wait_ms = (time.perf_counter() - stream.t_submit) * 1000
        if prompt is None:  # the layout needs whole text: sentence by sentence
            self._opening.append(_Opening(stream, None, sentences=_Sentences()))
            return
        self._opening.append(_Opening(stream, prompt))

    def feed(self) -> None:
        """Hand new text to the prompts that wait for it; start the streams whose prefill it decided;
        end the text of streams that waited longer than ``text_wait_s``."""
        for opening in list(self._opening):
            self._feed_opening(opening)
        for act in self._active + self._prefilling:
            if act.failed or (act.prompt is None and act.sentences is None):
                continue
            self._feed_started(act)

    def _feed_opening(self, opening: _Opening) -> None:
        """Feed a stream not started yet; start it once its text decided its prefill."""
        stream = opening.stream
        try:
            if stream.cancelled:
                self._opening.remove(opening)
                self._delivery.finish_cancelled(stream)
                return
            if opening.sentences is not None:
                opening.seen, pieces = self._new_sentences(stream, opening.sentences, opening.seen)
                if pieces:
                    self._opening.remove(opening)
                    act = self._pieces.start(stream, prefill=False, pieces=pieces)
                    act.sentences, act.seen = opening.sentences, opening.seen
                    self._prefilling.append(act)
                elif stream.feed is not None and stream.feed.closed:
                    raise InvalidRequest("text has nothing to speak", field="text")
                return
            assert opening.prompt is not None
            opening.seen = self._update_prompt(stream, opening.prompt, opening.seen)
            if opening.prompt.ready:
                self._opening.remove(opening)
                self._prefilling.append(self._started(stream, opening.prompt, opening.seen))
        except Exception as e:
            if opening in self._opening:
                self._opening.remove(opening)
            if not isinstance(e, InvalidRequest):
                log.exception("request %s failed to start", stream.timing.request_id)
            stream._fail(e)

    def _feed_started(self, act: Active) -> None:
        """Feed a started stream: its prompt the new text, or (whole-text layout) its new sentences."""
        try:
            if act.sentences is not None:
                self._more_sentences(act)
                return
            assert act.prompt is not None
            seen = self._update_prompt(act.stream, act.prompt, act.seen)
            if seen != act.seen and act.prompt.closed:  # the whole text's limit, as if given at once
                act.generator.max_frames = act.max_frames = self._text_limit(act.stream)
            act.seen = seen
        except Exception as e:
            for group in (self._active, self._prefilling):
                if act in group:
                    group.remove(act)
            act.fail(e)

    def _new_sentences(
        self, stream: SynthesisStream, sentences: _Sentences, seen: int
    ) -> tuple[int, list[str]]:
        """The pieces of the sentences completed since feed version ``seen`` (a whole-text layout)."""
        feed = stream.feed
        assert feed is not None
        self._check_text_wait(stream)
        if feed.version == seen:
            return seen, []
        raw, closed, version = feed.snapshot()
        pieces = [p for sentence in sentences.take(raw, closed) for p in self._pieces.plan(sentence)]
        return version, pieces

    def _more_sentences(self, act: Active) -> None:
        """New sentences of a whole-text layout's stream become its next pieces; a stream that waited
        for them goes on, and one whose text closed with nothing left ends."""
        assert act.sentences is not None and act.stream.feed is not None
        act.seen, pieces = self._new_sentences(act.stream, act.sentences, act.seen)
        act.pieces += pieces
        act.stream.timing.pieces += len(pieces)
        if not act.text_wait:
            if pieces:
                self._pieces.look_ahead(act)
            return
        if pieces:
            act.text_wait = False
            self.resume(act)
            self._pieces.next_piece(act)
        elif act.stream.feed.closed:
            act.text_wait = False
            self.resume(act)
            self._active.remove(act)
            self._delivery.finish(act)

    def _check_text_wait(self, stream: SynthesisStream) -> None:
        """Take the text as complete after ``text_wait_s`` without any (it speaks to its end)."""
        feed = stream.feed
        assert feed is not None
        if not feed.closed and time.monotonic() - feed.last_change > self._config.text_wait_s:
            stream.timing.extra["text_timeout"] = True
            log.info(
                "request %s got no text for %.1f s: its text is taken as complete",
                stream.timing.request_id,
                self._config.text_wait_s,
                extra={"request_id": stream.timing.request_id},
            )
            feed.close()

    def _update_prompt(self, stream: SynthesisStream, prompt: OpenPrompt, seen: int) -> int:
        """Feed ``prompt`` the stream's text if it changed (closing it after ``text_wait_s`` without
        text); returns the feed version it has now seen."""
        feed = stream.feed
        assert feed is not None
        self._check_text_wait(stream)
        if feed.version == seen:
            return seen
        raw, closed, version = feed.snapshot()
        text = normalize_text(raw)
        prompt.update(text, closed)
        if closed:
            stream.timing.extra["text_chars"] = len(text)
        return version

    def _text_limit(self, stream: SynthesisStream) -> int:
        """The frame limit of a stream with text in pieces: the caller's ``max_frames``, else the
        whole text's derived limit once it is complete, and ``max_frames_cap`` until then."""
        feed = stream.feed
        if stream.request.max_frames is not None:
            return stream.request.max_frames
        if feed is None or not feed.closed:
            return self._config.max_frames_cap
        return self._pieces.frame_limit(normalize_text(feed.snapshot()[0]))

    def _started(self, stream: SynthesisStream, prompt: OpenPrompt, seen: int) -> Active:
        """The admitted stream of an open prompt whose prefill is decided (prefilled between frames);
        ``seen``: the feed version the prompt holds (text pushed since is fed on the next round)."""
        t0 = time.perf_counter()
        req = stream.request
        limit = self._text_limit(stream)
        model = self._model()
        gen = model.new_generator(prompt, req.sampling, limit)
        stream.timing.prompt_ms = (time.perf_counter() - t0) * 1000
        if gen.seed is not None:
            stream.timing.extra["seed"] = int(gen.seed)
        first = req.first_chunk_frames or self._config.first_chunk_frames
        decoder = model.new_decoder(stream.voice, seed=gen.seed)
        act = Active(stream, gen, decoder, limit, target=first, first=first)
        act.prompt, act.seen = prompt, seen
        return act

    # -- waiting for text ------------------------------------------------------------------------
    @staticmethod
    def resume(act: Active) -> None:
        """``act`` no longer waits for text: count the wait."""
        if act.wait_since is not None:
            act.wait_s += time.monotonic() - act.wait_since
            act.wait_since = None

    def wait_for_text(self, act: Active) -> None:
        """``act``'s next frame needs text not yet final: no step meanwhile.

        Waiting for a token keeps the chunk schedule (a partial chunk waits with it), so the chunks,
        and the audio decoded from them, are bitwise those of the whole text at once. Waiting for the
        next sentence (a whole-text layout) sends the spoken sentence's last frames at once instead.
        """
        if act.wait_since is None:
            act.wait_since = time.monotonic()
            act.waits += 1
            if act.text_wait:
                self._delivery.flush_held(act)
