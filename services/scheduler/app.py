"""Wiring only: the scheduler service's FastAPI app, its subscribers and its attempt poller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from services.scheduler import api, handlers
from services.scheduler.config import NotificationSettings, SchedulerSettings
from services.scheduler.jobs import JobError
from services.scheduler.ladder import ProviderPool, check_reachable, load_ladder
from services.scheduler.lifecycle import Scheduler
from services.scheduler.notifications import handlers as notification_handlers
from services.scheduler.notifications import routes as notification_routes
from services.scheduler.notifications.notifier import Notifier
from services.scheduler.retrain import Retrainer
from services.scheduler.traffic import Traffic
from services.scheduler.webhooks import ReportReceiver
from shared import bus
from shared.events import Event
from shared.service import ServiceRuntime
from shared.settings import Settings
from shared.signing import SqlNonceStore
from shared.storage import ObjectStore

SERVICE = "scheduler"
log = logging.getLogger("tuneloop.scheduler")


def create_app(settings: Settings | None = None) -> FastAPI:
    runtime = ServiceRuntime(SERVICE, settings)
    common = runtime.settings
    own = SchedulerSettings.load(common.app)

    ladder = load_ladder(own.providers_file)
    check_reachable(ladder, own.public_url)

    async def publish(event: Event) -> None:
        await bus.publish(runtime.broker, event)

    scheduler = Scheduler(
        engine=runtime.engine,
        store=ObjectStore.from_settings(common.s3),
        publish=publish,
        pool=ProviderPool(ladder),
        settings=own,
        data_dir=common.app.data_dir.resolve(),
        webhook_base=runtime.address,
        ingest_url=own.ingest(common),
        http=httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0)),
    )
    reports = ReportReceiver(
        scheduler,
        nonces=SqlNonceStore(runtime.engine),
        tolerance_s=common.auth.signature_tolerance_s,
    )
    retrainer = Retrainer(
        engine=runtime.engine,
        scheduler=scheduler,
        traffic=Traffic(
            scheduler.http, scheduler.ingest_url, common.auth.service_token.get_secret_value()
        ),
        publish=publish,
    )
    notifier = Notifier(
        engine=runtime.engine,
        settings=NotificationSettings(),
        server_secret=own.webhook_secret.get_secret_value(),
        allow_http=common.app.is_development,
        publish=publish,
        pool=scheduler.pool,
        platform_cap=own.tenant_monthly_cap,
    )
    runtime.include_router(handlers.build_router(scheduler))
    runtime.include_router(notification_handlers.build_router(notifier))
    poller = _Poller(scheduler, retrainer, own.poll_interval_s, own.retrain_interval_s)
    runtime.on_lifecycle(poller.start, poller.stop)
    runtime.on_lifecycle(notifier.start, notifier.stop)
    app = runtime.build_app(
        api.router,
        summary="Fine-tuning jobs API (OpenAI's), dataset analysis into an explained recipe, "
        "attempts on the GPU ladder's providers and the trainer's signed reports; tenants' "
        "notification rules and their signed webhooks.",
    )
    app.include_router(notification_routes.router)
    app.include_router(api.internal)
    app.add_exception_handler(JobError, _job_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.state.scheduler = scheduler
    app.state.reports = reports
    app.state.retrainer = retrainer
    app.state.notifier = notifier
    return app


def _openai_error(status: int, message: str, param: str | None, code: str) -> dict[str, Any]:
    """OpenAI's error body (the SDKs put `error.message` in the exception's text), with our
    usual `detail` beside it."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    error = {"message": message, "type": kind, "param": param, "code": code}
    return {"error": error, "detail": message}


async def _job_error(request: Request, exc: JobError) -> JSONResponse:
    return JSONResponse(_openai_error(exc.status, str(exc), exc.param, exc.code), exc.status)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """The key refused (401, 403 from shared.auth) or a route not found, in OpenAI's shape too,
    so the SDK's exception says why."""
    code = {401: "invalid_api_key", 403: "insufficient_scope", 404: "not_found"}
    body = _openai_error(exc.status_code, str(exc.detail), None, code.get(exc.status_code, ""))
    return JSONResponse(body, exc.status_code, headers=exc.headers)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = jsonable_encoder(exc.errors())
    fields = [".".join(str(p) for p in e["loc"] if p != "body") or "body" for e in errors]
    message = "; ".join(f"{f}: {e['msg']}" for f, e in zip(fields, errors, strict=True))
    body = _openai_error(422, message, fields[0] if fields else None, "invalid_value")
    body["detail"] = errors  # FastAPI's own list, as the OpenAPI document describes
    return JSONResponse(body, 422)


class _Poller:
    """Checks the live attempts every few seconds (ended, overdue, silent) and places queued
    jobs (attempts.py); checks the retrain policies for new traffic, less often (retrain.py)."""

    def __init__(
        self, scheduler: Scheduler, retrainer: Retrainer, interval_s: float, retrain_s: float
    ) -> None:
        self.scheduler, self.retrainer = scheduler, retrainer
        self.interval_s, self.retrain_s = interval_s, retrain_s
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._run(), name="scheduler-attempts"),
            asyncio.create_task(self._retrain(), name="scheduler-retrain"),
        ]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.scheduler.attempts.drain()
        await self.scheduler.http.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.scheduler.attempts.check()
            except Exception:  # the database away, say: said, and tried again next round
                log.exception("checking running attempts failed")
            await asyncio.sleep(self.interval_s)

    async def _retrain(self) -> None:
        while True:
            await asyncio.sleep(self.retrain_s)
            try:
                await self.retrainer.check()
            except Exception:  # said, and tried again next round
                log.exception("checking retrain policies failed")
