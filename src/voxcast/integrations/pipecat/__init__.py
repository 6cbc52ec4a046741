"""Pipecat TTS services that speak through a voxcast server (``pip install "voxcast[pipecat]"``).

::

    from voxcast.integrations.pipecat import VoxcastTTSService

    tts = VoxcastTTSService(base_url="http://127.0.0.1:8000", api_key=None,
                            settings=VoxcastTTSService.Settings(voice="ryan"))
    pipeline = Pipeline([transport.input(), stt, llm, tts, transport.output()])

:class:`VoxcastTTSService` (``http``): each sentence Pipecat hands over is one streamed
``POST /v1/audio/speech`` (raw 16-bit PCM at the pipeline's output rate, resampled by the server), so
audio frames reach the pipeline as the server generates them. An interruption cancels the running
request: the connection is closed and the server stops generating within one frame.

:class:`VoxcastWebsocketTTSService` (``websocket``) speaks the LLM's tokens as they come instead:
Pipecat's ``TOKEN`` text aggregation feeds one reply (a turn) into the server's WebSocket
(``/v1/audio/speech/stream``, ``text_mode`` ``words``), so audio starts at the reply's first complete
word rather than its first sentence. An interruption sends ``clear``: the server stops within one
frame and drops the rest.

Both (``base``): the same constructor arguments and runtime settings (``voice``, ``language``,
``instructions``, ``speed``). Every turn (an LLM reply, a ``TTSSpeakFrame``, text outside any reply)
is bracketed by one ``TTSStartedFrame`` and one ``TTSStoppedFrame`` and spoken to its last word
unless interrupted; an ``EndFrame`` speaks the text still buffered before the pipeline ends. Both ask
for the streaming-text layout (``non_streaming_text: false``), so with the same text and ``seed``
they give the same audio. TTFB and usage metrics are reported as Pipecat expects. voxcast's own
request fields (``seed``, ``language``, sampling, ...) go in ``extra``.
"""

from voxcast.integrations.pipecat.base import VoxcastTTSSettings
from voxcast.integrations.pipecat.http import VoxcastTTSService
from voxcast.integrations.pipecat.websocket import VoxcastWebsocketTTSService

__all__ = ["VoxcastTTSService", "VoxcastTTSSettings", "VoxcastWebsocketTTSService"]
