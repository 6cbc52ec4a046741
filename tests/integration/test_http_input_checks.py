"""Inputs the JSON path refused but other paths took, against the real HTTP server (tiny CustomVoice
model): multipart text fields that are not UTF-8, a lone surrogate in ``model``, and sampling fields
given as strings, booleans or NaN."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.engines import reference_wav
from tests.fixtures.http_server import running
from voxcast.engine.engine import Engine
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.storage.local import LocalBlobStore


@pytest.fixture(scope="module")
def base_url(tiny_service: Service) -> Iterator[str]:
    with running(create_app(ServiceHolder(tiny_service), HttpConfig())) as url:
        yield url


def _multipart(fields: list[tuple[str, bytes]], audio: bytes) -> tuple[bytes, str]:
    boundary = "vxboundary42"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value + b"\r\n"
        for name, value in fields
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="audio"; filename="r.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n".encode()
        + audio
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@pytest.fixture(scope="module")
def base_model_url(base_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = LocalBlobStore(tmp_path_factory.mktemp("store"), fsync=False)
    service = Service.assemble(ServiceConfig(store_audio=False), base_engine, store)
    with running(create_app(ServiceHolder(service), HttpConfig())) as url:
        yield url


@pytest.mark.parametrize("field", ["name", "ref_text"])
def test_a_multipart_field_that_is_not_utf8_is_refused_naming_it(base_model_url: str, field: str) -> None:
    """Before: read as Latin-1 and stored (``name`` "nÿþ", 201). Tiny Base model."""
    body, content_type = _multipart([(field, b"caf\xc3\xa9 \xff\xfe")], reference_wav(24000, 3.0))
    r = httpx.post(
        base_model_url + "/v1/audio/voices", content=body, headers={"Content-Type": content_type}, timeout=60
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and "UTF-8" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    ("raw", "field", "says"),
    [
        ('"model": "qwen\\ud800"', "model", "surrogate"),
        ('"seed": "7"', "seed", "integer"),
        ('"seed": true', "seed", "integer"),
        ('"top_k": true', "top_k", "integer"),
        ('"temperature": NaN', "temperature", "finite"),
    ],
)
def test_json_fields_the_schema_refuses(base_url: str, raw: str, field: str, says: str) -> None:
    """Before: a surrogate in ``model`` and ``"7"``/``true`` as seed or top_k were accepted; a NaN
    temperature was refused as "must be <= 2"."""
    body = '{"input": "Hi.", "voice": "ryan", "response_format": "pcm", ' + raw + "}"
    r = httpx.post(
        base_url + "/v1/audio/speech", content=body, headers={"Content-Type": "application/json"}, timeout=60
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and says in r.json()["error"]["message"], r.text
