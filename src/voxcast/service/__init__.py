"""Bootstrap and request flow shared by every entry point: config -> engine -> store -> voices -> cache.

``Service.load(config)`` loads and warms the engine and opens the blob store, the voice registry and
the rendered-audio cache. ``service.synthesize(request)`` returns a lazy :class:`ServiceStream` of
:class:`EncodedChunk` (bytes in the requested format and rate); after iteration ``stream.result``
holds the :class:`SynthesisResult` (timing, blob key of the complete file). Adapters (CLI, RunPod,
RQ) only translate to and from this.

A deterministic request (seeded or greedy) whose rendering is in the cache is streamed from storage
without touching the model (``timing.cache_hit``); a miss renders and then fills the cache once the
stream has ended, so the first chunk is never delayed. Storage failures never fail a synthesis: they
are reported in ``result.cache_error``.

Modules: :mod:`.service` (``Service``: load, assemble, close, synthesize, open, and a request's
dispatch), :mod:`.config` (``ServiceConfig`` from the environment), :mod:`.stream` (``ServiceStream``,
``EncodedChunk``, ``SynthesisResult``: what a caller iterates and gets back), :mod:`.voice_resolution`
(which voice a request is spoken in), :mod:`.backends` (what a request uses of the service, its
result), :mod:`.cached` (a request served from the audio cache), :mod:`.rendered` (a request rendered
through the engine, then stored). Everything a caller needs is imported here.
"""

from voxcast.service.cached import CACHE_READ_CHUNK_BYTES as CACHE_READ_CHUNK_BYTES
from voxcast.service.config import MAX_URL_EXPIRES_S as MAX_URL_EXPIRES_S
from voxcast.service.config import ServiceConfig
from voxcast.service.service import Service
from voxcast.service.stream import EncodedChunk, ServiceStream, SynthesisResult

__all__ = ["EncodedChunk", "Service", "ServiceConfig", "ServiceStream", "SynthesisResult"]
