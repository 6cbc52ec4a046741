"""Reference audio given as an http(s) URL (vLLM-Omni's ``ref_audio``), fetched only from allowed hosts.

By default the server fetches nothing: a URL is refused naming ``ref_audio``. ``VOXCAST_REF_AUDIO_URL_HOSTS``
(comma-separated host names, exact and case-insensitive) allows those hosts; a fetch is bounded in time
(10 s) and size (the inline limit, :data:`~voxcast.engine.request.MAX_REF_AUDIO_BYTES`) and follows no
redirect to another host.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection
from typing import Any

from voxcast.engine.request import MAX_REF_AUDIO_BYTES
from voxcast.errors import InvalidRequest

__all__ = ["FETCH_TIMEOUT_S", "fetch_ref_audio", "parse_hosts"]

FETCH_TIMEOUT_S = 10.0


def parse_hosts(value: str | None) -> frozenset[str]:
    """``VOXCAST_REF_AUDIO_URL_HOSTS`` as a set of lower-case host names (empty: fetch nothing)."""
    return frozenset(h.strip().lower() for h in (value or "").split(",") if h.strip())


class _SameHost(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).hostname != urllib.parse.urlsplit(req.full_url).hostname:
            raise InvalidRequest("ref_audio: the URL redirects to another host", field="ref_audio")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_ref_audio(url: str, hosts: Collection[str]) -> bytes:
    """The bytes at ``url`` when its host is in ``hosts``.

    Raises:
        InvalidRequest: the host is not allowed, the fetch failed or timed out, or the file is empty or
            larger than the inline limit (field ``ref_audio``).
    """
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidRequest("ref_audio: not an http(s) URL", field="ref_audio")
    if host not in hosts:
        raise InvalidRequest(
            f"ref_audio: this server fetches no URL from {host!r} (VOXCAST_REF_AUDIO_URL_HOSTS); "
            "send the audio as base64 or a data: URI",
            field="ref_audio",
        )
    opener = urllib.request.build_opener(_SameHost)
    try:
        with opener.open(url, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read(MAX_REF_AUDIO_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise InvalidRequest(f"ref_audio: could not fetch {url[:200]!r}: {e}", field="ref_audio") from e
    if not data:
        raise InvalidRequest("ref_audio: the URL gave an empty file", field="ref_audio")
    if len(data) > MAX_REF_AUDIO_BYTES:
        raise InvalidRequest(
            f"ref_audio: the file is larger than {MAX_REF_AUDIO_BYTES} bytes", field="ref_audio"
        )
    return data
