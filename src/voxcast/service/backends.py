"""What one request uses of its service, and the result it reports whichever path served it.

:class:`Backends` holds the engine, the blob store, the audio cache, the store guard and the
watermark a request runs against. The service reads them from its attributes when a request starts
(:meth:`Service._run <voxcast.service.service.Service>`) and hands them to the cache path
(:mod:`voxcast.service.cached`) and the engine path (:mod:`voxcast.service.rendered`), so that those
take their collaborators as explicit parameters instead of reaching into the service.
"""

from __future__ import annotations

from dataclasses import dataclass

from voxcast.audio.formats import stream_content_type
from voxcast.cache import AudioCache
from voxcast.engine.engine import Engine
from voxcast.engine.timing import Timing
from voxcast.errors import StorageError
from voxcast.service.stream import ServiceStream, SynthesisResult
from voxcast.storage.base import BlobStore
from voxcast.storage.guard import StoreGuard
from voxcast.storage.pending import PendingWrites
from voxcast.watermark.perth import PerthWatermarker

__all__ = ["Backends"]


@dataclass(frozen=True, slots=True)
class Backends:
    """The service's parts one request uses (see the module docstring).

    Attributes:
        engine: the loaded engine.
        store: the blob store (renders, presigned URLs).
        cache: the rendered-audio cache over ``store``.
        guard: deadlines and circuit breaker of the store calls on the request's path.
        watermarker: marks stored renders, or None.
        url_expires_s: lifetime of the presigned URL of a stored file.
        pending: where a file the store failed is kept to be written later, or None.
    """

    engine: Engine
    store: BlobStore
    cache: AudioCache
    guard: StoreGuard
    watermarker: PerthWatermarker | None
    url_expires_s: int
    pending: PendingWrites | None = None

    def result(
        self,
        s: ServiceStream,
        timing: Timing,
        nbytes: int,
        duration_s: float,
        audio_key: str | None,
        voice_id: str | None,
        error: str | None,
    ) -> SynthesisResult:
        """The result of ``s``, with a presigned URL of ``audio_key`` when one was stored (a failure
        to sign is reported like a storage failure, in ``cache_error``)."""
        req = s.request
        url = None
        if audio_key is not None:
            try:
                url = self.store.presigned_url(audio_key, self.url_expires_s)
            except StorageError as e:
                error = error or str(e)
        return SynthesisResult(
            request_id=s.request_id,
            format=req.response_format,
            sample_rate=req.sample_rate,
            content_type=stream_content_type(req.response_format, req.sample_rate),
            bytes=nbytes,
            duration_s=duration_s,
            timing=timing,
            audio_key=audio_key,
            audio_url=url,
            voice_id=voice_id,
            cache_error=error,
        )
