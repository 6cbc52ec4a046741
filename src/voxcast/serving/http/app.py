"""The ASGI application (FastAPI on Starlette, served by uvicorn): routes, auth, errors, readiness.

Routes: ``POST /v1/audio/speech`` (OpenAI-compatible, :mod:`.streaming`), ``/v1/audio/voices``
(:mod:`.voices`), ``/v1/audio/speech/stream`` (WebSocket, :mod:`.ws`), ``/v1/audio/speech/ws`` (the
``nari.speech.v1`` WebSocket, :mod:`.nari_ws`), ``GET /v1/models``,
``/metrics`` (Prometheus), and ``/ping`` / ``/health`` for load balancers (RunPod's
load-balancing endpoints: 204 while the model loads and warms, 200 once ready). The service is held
by a :class:`ServiceHolder`, which may load it in the background so the health routes answer at once.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

from voxcast.errors import VoxcastError
from voxcast.ids import request_id_for
from voxcast.logs import set_request_id
from voxcast.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from voxcast.metrics import Metrics
from voxcast.service import Service
from voxcast.serving.drain import Drain
from voxcast.serving.http.body import ClientDisconnected, read_json
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.http.errors import HttpError, error_body, error_for
from voxcast.serving.http.exposure import OriginGuard
from voxcast.serving.http.nari_ws import NariSocket
from voxcast.serving.http.nari_ws import subprotocol as nari_subprotocol
from voxcast.serving.http.sockets import quiet_invalid_utf8
from voxcast.serving.http.speech import speech_request
from voxcast.serving.http.streaming import Counters, open_speech
from voxcast.serving.http.voices import voice_routes
from voxcast.serving.http.ws import SpeechSocket

__all__ = ["ServiceHolder", "create_app", "health_app"]

log = logging.getLogger(__name__)

#: voxcast's request fields under the names OpenAI's clients send.
_OPENAI_NAMES = {"text": "input", "instruct": "instructions"}


class ServiceHolder:
    """The service the routes use: given ready, or loaded on a background thread (:meth:`load_in_background`).

    ``state`` (the metrics' phase, which ``/ping`` and ``/metrics`` report): ``loading``, ``warming``,
    ``ready``, ``failed`` or ``draining`` (after SIGTERM: ``/ping`` answers 503 so no new traffic comes).
    """

    def __init__(self, service: Service | None = None) -> None:
        self.service = service
        #: The process's metrics: the service's, or made here (reporting loading and warming) and
        #: handed to the service that :meth:`load_in_background` loads.
        self.metrics = service.metrics if service is not None else Metrics()
        self.error: str | None = None
        self.load_s: float | None = None
        #: The server's drain (``voxcast serve`` sets it): responses and WebSockets still open at its
        #: deadline end with a ``shutdown`` error.
        self.drain: Drain | None = None
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> str:
        return self.metrics.phase

    @state.setter
    def state(self, value: str) -> None:
        self.metrics.phase = value

    def load_in_background(
        self, load: Callable[[Metrics], Service], on_failure: Callable[[BaseException], None]
    ) -> None:
        """Run ``load(metrics)`` on a thread; ``on_failure`` gets its exception (the server then exits)."""

        def run() -> None:
            t0 = time.perf_counter()
            try:
                self.service = load(self.metrics)
            except BaseException as e:
                self.state, self.error = "failed", f"{type(e).__name__}: {e}"
                log.exception("voxcast serve: loading the service failed")
                on_failure(e)
                return
            self.load_s = time.perf_counter() - t0
            self.state = "draining" if self.drain is not None and self.drain.begun else "ready"
            log.info("voxcast serve: ready (loaded and warmed in %.1f s)", self.load_s)

        self._thread = threading.Thread(target=run, name="voxcast-load", daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until loading ended; True if the service is ready."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.state == "ready"

    def get(self) -> Service:
        """The ready service; 503 (with ``Retry-After``) while it loads or after it failed."""
        # once loaded, the service serves in every phase but these (an idle unload's reload is
        # done by the first request, the others wait for it)
        if self.service is None or self.state in ("failed", "draining"):
            message = {
                "loading": "the model is loading",
                "warming": "the model is warming up",
                "draining": "the server is draining (shutting down): retry on another instance",
            }.get(self.state, f"the service failed to load: {self.error}")
            raise HttpError(503, message, code="engine_unavailable", headers={"Retry-After": "5"})
        return self.service


def _error_response(e: BaseException) -> JSONResponse:
    err = error_for(e)
    return JSONResponse(
        error_body(err.status, err.message, err.code, err.field), err.status, headers=err.headers
    )


def _unavailable_close(state: str, message: str) -> tuple[int, str]:
    """The close code and reason of a WebSocket the service cannot take: 1001 (going away) while the
    server drains, 1011 after a failed load, else 1013 (try again later) while it loads or warms."""
    code = {"draining": 1001, "failed": 1011}.get(state, 1013)
    return code, message.encode()[:123].decode(errors="ignore")  # a close reason's limit: 123 bytes


def _health(holder: ServiceHolder, counters: Counters | None) -> Response:
    """204 while the service first loads and warms (RunPod's convention), 503 failed or draining,
    else 200 (also while idle-unloaded or reloading: a request is served, after the reload), with
    the engine's admission snapshot (``capacity``: round ms by batch size, refusals, and why the next
    real-time request would be refused, or null)."""
    if holder.state in ("failed", "draining"):
        return JSONResponse({"status": holder.state, "error": holder.error}, 503)
    if holder.service is None:
        return Response(status_code=204)
    body: dict[str, Any] = {"status": holder.state, "load_s": holder.load_s}
    if holder.service is not None:
        body["model"] = holder.service.engine.identity
        body["capacity"] = holder.service.engine.capacity()  # admission: measured rounds, refusals
    if counters is not None:
        body["requests"] = counters.__dict__
    return JSONResponse(body)


def _install_errors(app: FastAPI) -> None:
    async def voxcast_error(_: Request, e: Exception) -> JSONResponse:
        return _error_response(e)

    async def http_error(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, StarletteHTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return JSONResponse(error_body(e.status_code, str(e.detail), code), e.status_code, headers=e.headers)

    async def validation_error(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, RequestValidationError)
        first = e.errors()[0] if e.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(
            error_body(400, str(first.get("msg", "invalid request")), "invalid_request", field), 400
        )

    async def client_gone(request: Request, _: Exception) -> Response:
        log.info(
            "%s %s: the client disconnected before its request was read", request.method, request.url.path
        )
        return Response(status_code=ClientDisconnected().status)  # nobody reads it

    app.add_exception_handler(ClientDisconnect, client_gone)
    app.add_exception_handler(HttpError, voxcast_error)
    app.add_exception_handler(VoxcastError, voxcast_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)


def _install_exposure(app: FastAPI, config: HttpConfig, on_refused: Callable[[str, int], None]) -> None:
    """CORS headers for the allowed browser origins, and refusal of the others and of a ``Host`` not
    served (outermost)."""
    origins = list(config.exposure.cors_origins)
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
            expose_headers=["X-Request-Id"],
        )
    app.add_middleware(
        OriginGuard,
        exposure=config.exposure,
        host_names=config.exposure.host_names(config.host, config.api_key),
        on_refused=on_refused,
    )


def health_app(holder: ServiceHolder) -> FastAPI:
    """Only ``/ping`` and ``/health`` (for a separate ``PORT_HEALTH``)."""
    app = FastAPI(title="voxcast health", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/ping", lambda: _health(holder, None), methods=["GET"])
    app.add_api_route("/health", lambda: _health(holder, None), methods=["GET"])
    return app


def create_app(holder: ServiceHolder, config: HttpConfig) -> FastAPI:
    """The API application on ``holder``'s service."""
    docs = config.exposure.docs_on(config.api_key)
    app = FastAPI(
        title="voxcast",
        summary="Streaming text-to-speech (OpenAI-compatible speech API)",
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    quiet_invalid_utf8()  # uvicorn's traceback per invalid UTF-8 frame: the sockets log one line
    counters = Counters()

    def refused_early(reason: str, status: int) -> None:
        """Count a request refused before its route ran (``voxcast_http_refused_total``, ``/health``)."""
        holder.metrics.http_refused.labels(reason, str(status)).inc()
        counters.refused[reason] = counters.refused.get(reason, 0) + 1

    _install_exposure(app, config, refused_early)
    app.state.counters = counters
    app.state.holder = holder
    _install_errors(app)

    def authorized(headers: Any, query: Any) -> bool:
        if config.api_key is None:
            return True
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":  # a browser's WebSocket cannot set headers: ?api_key=
            token = query.get("api_key", "")
        return hmac.compare_digest(token.strip().encode(), config.api_key.encode())

    async def authorize(request: Request) -> None:
        if not authorized(request.headers, {}):
            refused_early("api_key", 401)
            raise HttpError(
                401,
                "missing or wrong API key (Authorization: Bearer <VOXCAST_API_KEY>)",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    app.add_api_route("/ping", lambda: _health(holder, counters), methods=["GET"])
    app.add_api_route(
        "/metrics",
        lambda: Response(holder.metrics.exposition(), media_type=METRICS_CONTENT_TYPE),
        methods=["GET"],
        dependencies=[Depends(authorize)] if config.exposure.metrics_auth else [],
    )
    app.add_api_route("/health", lambda: _health(holder, counters), methods=["GET"])

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        service = holder.get()
        model = {"id": service.engine.identity, "object": "model", "created": 0, "owned_by": "voxcast"}
        return {"object": "list", "data": [model]}

    def refused(e: BaseException) -> None:
        """Count a request that failed before the service saw it (bad JSON, 413, 503...) as the
        service counts the rest (``voxcast_requests_total``)."""
        holder.metrics.request_ended("http", None, e)

    @v1.post("/audio/speech")
    async def speech(request: Request) -> Response:
        counters.requests += 1
        body: Any = None
        to_service = False  # from service.synthesize on, the service records the outcome
        try:
            service = holder.get()
            body = await read_json(request, config.max_body_bytes)
            fields, stream_format = speech_request(body)
            header_id = request.headers.get("x-request-id", "").strip()
            if header_id and "request_id" not in fields:  # a tracing header never fails a request
                fields["request_id"] = request_id_for(header_id)
            to_service = True
            stream = service.synthesize(fields, entry="http", refusable=True)
            set_request_id(stream.request_id)  # this request's task
            return await open_speech(
                stream,
                stream_format,
                counters,
                queue_chunks=config.queue_chunks,
                stall_s=config.stall_s,
                drain=holder.drain,
            )
        except ClientDisconnected as e:
            counters.disconnected += 1
            refused(e)
            log.info("speech request: %s", e.message)
            return _error_response(e)
        except (HttpError, VoxcastError) as e:
            if not to_service:
                refused(e)
            sent = body if isinstance(body, dict) else {}
            if isinstance(e, VoxcastError) and e.field in _OPENAI_NAMES:
                openai_name = _OPENAI_NAMES[e.field]
                if openai_name in sent or e.field not in sent:  # as sent; a missing one by OpenAI's name
                    e.field = openai_name
            counters.error(error_for(e).code)
            return _error_response(e)
        except Exception as e:
            if not to_service:
                refused(e)
            counters.error("internal_error")
            log.exception("speech request failed before its first audio")
            return _error_response(e)

    async def accepted(ws: WebSocket, subprotocol: str | None = None) -> Service | None:
        """The service for a WebSocket, accepted; None once it was refused (and closed)."""
        if not authorized(ws.headers, ws.query_params):
            refused_early("api_key", 403)  # a handshake closed before it is accepted answers 403
            await ws.close(code=1008, reason="missing or wrong API key")
            return None
        await ws.accept(subprotocol=subprotocol)
        try:
            return holder.get()
        except HttpError as e:
            await ws.send_json({"type": "error", **error_body(e.status, e.message, e.code)})
            await ws.close(*_unavailable_close(holder.state, e.message))
            return None

    @app.websocket("/v1/audio/speech/stream")
    async def speech_socket(ws: WebSocket) -> None:
        service = await accepted(ws)
        if service is not None:
            await SpeechSocket(ws, service, queue_chunks=config.queue_chunks, drain=holder.drain).run()

    @app.websocket("/v1/audio/speech/ws")
    async def nari_socket(ws: WebSocket) -> None:
        service = await accepted(ws, nari_subprotocol(ws))
        if service is not None:
            socket = NariSocket(
                ws, service, queue_chunks=config.queue_chunks, stall_s=config.stall_s, drain=holder.drain
            )
            await socket.run()

    v1.include_router(voice_routes(holder.get, config.max_body_bytes))
    app.include_router(v1)
    return app
