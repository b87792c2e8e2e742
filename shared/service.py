"""What every tuneloop service process shares: start-up, the bus, health, metrics, shutdown.

A service's `app.py` builds a `ServiceRuntime`, hands it its event router and HTTP router, and
gets a FastAPI app whose lifespan waits for NATS and the database (bounded), declares the
JetStream streams, starts the subscribers and the presence heartbeat, and stops them cleanly.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import nats.errors
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from faststream.nats import NatsRouter
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import bus, db
from shared.body_guard import BodyGuard
from shared.events import ServiceHeartbeat
from shared.logs import configure_logging
from shared.presence import Presence
from shared.processes import die_with_parent, settle_heap
from shared.redact import register_secret
from shared.settings import Settings, get_settings
from shared.telemetry import Telemetry, setup_telemetry

log = logging.getLogger("tuneloop.service")
Hook = Callable[[], Awaitable[None]]


class ServiceRuntime:
    """The wiring one service process needs; app.py adds only its own routers."""

    def __init__(self, name: str, settings: Settings | None = None) -> None:
        self.name = name
        self.settings = settings or get_settings()
        port = self.settings.services.port_of(name)
        self.address = f"http://{self.settings.app.bind_host}:{port}"
        self.instance_id = f"{name}-{socket.gethostname()}-{os.getpid()}"
        self.broker = bus.make_broker(self.settings.nats, service=name)
        self.presence = Presence(
            service=name,
            instance_id=self.instance_id,
            address=self.address,
            interval_s=self.settings.telemetry.heartbeat_interval_s,
        )
        bus.subscribe(self.broker, ServiceHeartbeat, service=name)(self.presence.record)
        self.engine = db.make_engine(self.settings.database_url)
        self._lifecycle: list[tuple[Hook, Hook]] = []
        self.telemetry: Telemetry | None = None  # set by build_app

    def on_lifecycle(self, start: Hook, stop: Hook) -> None:
        """Run `start` once the bus is up and `stop` (in reverse order) before it goes down."""
        self._lifecycle.append((start, stop))

    def include_router(self, router: NatsRouter) -> None:
        self.broker.include_router(router)

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(
            db.wait_until_ready, self.engine, timeout_s=self.settings.nats.connect_timeout_s
        )
        await bus.connect(self.broker, self.settings.nats)
        await bus.declare_streams(self.broker.connection, self.settings.nats)
        await self.broker.start()
        self.presence.start(self.broker)
        started: list[Hook] = []
        try:
            for start, stop in self._lifecycle:
                await start()
                started.append(stop)
            log.info("%s serving on %s (NATS %s)", self.name, self.address, self.settings.nats.url)
            # Start-up leaves ~160k long-lived objects; frozen, the collector stops rescanning
            # them in every full collection (a 150-200 ms pause, seen as p99 in bench-gateway).
            settle_heap()
            yield
        finally:
            for stop in reversed(started):
                await stop()
            await self.presence.stop()
            try:
                await self.broker.stop()
            except nats.errors.ConnectionReconnectingError:
                # Stopped while NATS is away: there is nothing to drain to. What consumers had
                # fetched and not acked comes back to the next process after its ack wait.
                log.warning("stopped while reconnecting to NATS; nothing was drained")
            self.engine.dispose()

    def health(self) -> dict[str, Any]:
        connection = self.broker.connection if self.broker.connection is not None else None
        if connection is None:
            bus_state = "not connected"
        elif connection.is_connected:
            bus_state = "connected"
        elif connection.is_reconnecting:
            bus_state = "reconnecting"
        else:
            bus_state = "disconnected"
        return {
            "service": self.name,
            "instance_id": self.instance_id,
            "status": "ok" if bus_state == "connected" else "degraded",
            "bus": bus_state,
            "peers": self.presence.peers(),
        }

    def _health_router(self) -> APIRouter:
        router = APIRouter(tags=["health"])

        @router.get("/healthz", summary="Liveness and what this instance sees")
        async def healthz() -> dict[str, Any]:
            return self.health()

        @router.get("/readyz", summary="503 while the bus is unreachable")
        async def readyz() -> JSONResponse:
            health = self.health()
            return JSONResponse(health, status_code=200 if health["bus"] == "connected" else 503)

        return router

    def build_app(
        self,
        api: APIRouter,
        *,
        summary: str,
        untraced: Callable[[MutableMapping[str, Any]], bool] | None = None,
    ) -> FastAPI:
        """The service's app. `untraced(scope)` picks requests FastAPI makes no span for: a hot
        path that counts its own metrics (the gateway's proxy routes), where a span per call
        would cost more than the work it describes. Every route's body passes BodyGuard (the
        key first, then TUNELOOP_MAX_JSON_BODY_BYTES) unless it is `reads_own_body`."""
        app = FastAPI(
            title=f"tuneloop {self.name}",
            summary=summary,
            lifespan=self.lifespan,
            telemetry={"exclude": untraced},
        )
        app.state.runtime = self
        app.state.db_engine = self.engine
        app.openapi = _with_error_messages(app.openapi)  # type: ignore[method-assign]
        app.add_exception_handler(RequestValidationError, validation_error)
        app.add_exception_handler(HTTPException, key_refused)
        app.include_router(self._health_router())
        app.include_router(api)
        app.add_middleware(
            BodyGuard, max_bytes=self.settings.app.max_json_body_bytes, engine=self.engine
        )
        app.add_middleware(ServedBy, service=self.name)
        self.telemetry = setup_telemetry(
            self.name, otlp_endpoint=self.settings.telemetry.otlp_endpoint, app=app
        )
        return app


_KEY_CODES = {401: "invalid_api_key", 403: "insufficient_scope"}


async def key_refused(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's HTTPException body (`detail`), plus, for a key refused (401, 403 from
    shared.auth), OpenAI's `error` beside it: the gateway answers SDK callers, whose exception
    reads `error.code` and `error.message`."""
    assert isinstance(exc, HTTPException)
    body: dict[str, Any] = {"detail": exc.detail}
    code = _KEY_CODES.get(exc.status_code)
    if code is not None:
        message = str(exc.detail)
        body["error"] = {"message": message, "type": "invalid_request_error", "param": None,
                         "code": code}  # fmt: skip
    return JSONResponse(body, exc.status_code, headers=exc.headers)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 (field errors, each echoing its input), less its 500 on input JSON cannot
    write back: Python's JSON parser reads `NaN`, `1e999` and lone surrogates (`"\\ud800"`)
    from a body, so numbers are echoed as strings and such characters escaped."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": _writable(jsonable_encoder(exc.errors()))}, status_code=422)


def _writable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode(errors="backslashreplace").decode()
        return value
    if isinstance(value, list):
        return [_writable(item) for item in value]
    if isinstance(value, dict):
        return {key: _writable(item) for key, item in value.items()}
    return value


def _with_error_messages(openapi: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """The app's OpenAPI document, its 422 body saying what our routes send: FastAPI documents
    `detail` as its list of field errors only, while a route refusing a well-formed request it
    cannot serve (an empty dataset selection, a bad tenant id) sends one message naming the field."""

    def document() -> dict[str, Any]:
        schema = openapi()  # FastAPI builds it once and keeps it; this edit is idempotent
        error = schema.get("components", {}).get("schemas", {}).get("HTTPValidationError")
        detail = error["properties"]["detail"] if error else None
        if detail is not None and "anyOf" not in detail:
            error["properties"]["detail"] = {
                "title": "Detail",
                "anyOf": [{"type": "string"}, {k: v for k, v in detail.items() if k != "title"}],
            }
        return schema

    return document


class ServedBy:
    """Adds `x-tuneloop-served-by: <service>` to every response: which service answered a call
    that the gateway forwarded is then visible to operators (and tests)."""

    def __init__(self, app: ASGIApp, service: str) -> None:
        self.app = app
        self.header = (b"x-tuneloop-served-by", service.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            headers = message.get("headers", [])
            # A response relayed from another service already says who served it.
            if message["type"] == "http.response.start" and all(
                k != self.header[0] for k, _ in headers
            ):
                message["headers"] = [*headers, self.header]
            await send(message)

        await self.app(scope, receive, tagged)


def prepare_process(name: str, settings: Settings) -> None:
    """Logging and secret redaction for a tuneloop process, before it does anything else."""
    configure_logging(name, level=settings.app.log_level, json=settings.app.log_json)
    register_secret(settings.s3.secret_key.get_secret_value())
    register_secret(settings.auth.admin_token.get_secret_value())


def prepare_worker(name: str) -> None:
    """For an app factory run by `run(..., workers=N)`: a worker process sets up logging and
    redaction as the parent did, and dies with the parent (a SIGKILLed service leaves no
    workers holding its port)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return  # one process: run() did it
    prepare_process(name, get_settings())
    if parent.pid is not None:
        die_with_parent(parent.pid, signal.SIGKILL)


def run(
    name: str,
    app: FastAPI | str,
    settings: Settings | None = None,
    *,
    workers: int = 1,
    access_log: bool = True,
    http: type[asyncio.Protocol] | Literal["httptools"] = "httptools",
) -> None:
    """`python -m services.<name>`: serve the app with uvicorn on the service's port.

    `app` is the app, or the import string of a factory calling `prepare_worker` (required for
    workers > 1: each worker process builds its own app and shares the listening socket).
    `access_log=False` for a service whose hot path counts its requests in metrics instead.
    `http`: uvicorn's HTTP protocol, or a subclass of it (the ingest gateway's).
    """
    settings = settings or get_settings()
    prepare_process(name, settings)
    uvicorn.run(
        app,
        factory=isinstance(app, str),
        workers=workers,
        host=settings.app.bind_host,
        port=settings.services.port_of(name),
        log_config=None,  # keep our structured, redacting handlers
        loop="uvloop",
        http=http,
        access_log=access_log,
        timeout_graceful_shutdown=10,
    )
