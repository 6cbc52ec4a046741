"""A LiveKit Agents TTS that speaks through a voxcast server (``pip install "voxcast[livekit]"``).

::

    from livekit.agents import AgentSession
    from voxcast.integrations.livekit import TTS

    session = AgentSession(stt=..., llm=..., tts=TTS(base_url="http://127.0.0.1:8000", voice="ryan"))

:class:`TTS` streams (``TTSCapabilities(streaming=True, aligned_transcript=True)``): each reply the
agent speaks is one :class:`SynthesizeStream`, its text pushed into one utterance on the server's
WebSocket (``/v1/audio/speech/stream``, ``text_mode`` ``words``) as the LLM writes it, so audio
starts at the reply's first complete word. The reply ends with ``flush`` or ``end_input`` (a
``mark`` on the socket, whose echo follows the last audio); an interruption (``aclose`` mid-reply)
sends ``clear``, and the server stops within one frame. Audio is 16-bit mono PCM at the TTS's
``sample_rate`` (24 kHz by default, resampled by the server); each utterance's word timestamps come
as LiveKit ``TimedString`` objects, timed from the reply's first audio. :meth:`TTS.synthesize` speaks a
whole text the same way (a :class:`ChunkedStream`). The streaming-text layout is asked for
(``non_streaming_text: false``), so with a ``seed`` in ``extra`` a reply gives the same bytes
however its text was cut. Past capacity a refused reply is sent again after the server's
``retry_after_s`` (for up to ``capacity_wait_s``); a dropped connection is replaced and the reply
retried as LiveKit's ``APIConnectOptions`` say. No LiveKit server is needed to use the class.
"""

from voxcast.integrations.livekit.tts import TTS, ChunkedStream, SynthesizeStream

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream"]
