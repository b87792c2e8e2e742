"""OpenTelemetry for our own services: traces to an OTLP/HTTP collector, metrics on /metrics.

FastAPI (>= 0.16x) instruments itself natively once global providers exist: a server span per
request named `GET /jobs/{job_id}`, and the `http.server.request.duration` histogram by route
template. So this module sets those providers up and adds only what FastAPI lacks:

- `http_server_requests_total{service,method,route,status}`, from one small ASGI middleware;
- seconds-scale buckets for the duration histogram (FastAPI's stop at 10 s; LLM calls do not);
- a `/metrics` route for Prometheus;
- redaction of every span attribute before export, so `?key=` never reaches the trace store.

Providers are process-wide: OpenTelemetry accepts global providers once, and Prometheus' registry
takes one collector per metric. The first `setup_telemetry` call creates them, with its service
name in the resource; later calls (tests build many apps in one process) reuse them, and their
metrics still carry their own `service` label. We never monkeypatch libraries.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI
from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Counter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.util.types import Attributes
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.redact import redact_text, redact_url

NAMESPACE = "tuneloop"
METRICS_PATH = "/metrics"
UNMATCHED_ROUTE = "unmatched"
# Seconds, for FastAPI's http.server.request.duration: a streamed completion can take minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Anything else is counted as _OTHER, so a client cannot mint label values.
_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}
)


@dataclass(frozen=True)
class Telemetry:
    """What a service uses: a tracer for its own spans, and the request counter."""

    service_name: str
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    tracer: trace.Tracer
    requests: Counter


@dataclass
class _Process:
    """Everything that must exist once per process."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    requests: Counter
    exporting_to: set[str]


_lock = threading.Lock()
_process: _Process | None = None


def setup_telemetry(
    service_name: str, *, otlp_endpoint: str = "", app: FastAPI | None = None
) -> Telemetry:
    """Set up tracing and metrics for this process, and instrument `app` when given.

    Idempotent: providers are created once per process, each app is instrumented once, and
    each OTLP endpoint gets one exporter however often it is passed.
    """
    with _lock:
        process = _process_state(service_name)
        if otlp_endpoint and otlp_endpoint not in process.exporting_to:
            exporter = RedactingSpanExporter(_otlp_exporter(otlp_endpoint))
            process.tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
            process.exporting_to.add(otlp_endpoint)
    telemetry = Telemetry(
        service_name=service_name,
        tracer_provider=process.tracer_provider,
        meter_provider=process.meter_provider,
        tracer=process.tracer_provider.get_tracer(f"{NAMESPACE}.{service_name}"),
        requests=process.requests,
    )
    if app is not None:
        instrument_app(app, telemetry)
    return telemetry


def instrument_app(app: FastAPI, telemetry: Telemetry) -> None:
    """Add the request counter middleware and the `/metrics` route to `app`, once each."""
    factories: list[object] = [m.cls for m in app.user_middleware]
    if RequestMetricsMiddleware not in factories:
        app.add_middleware(RequestMetricsMiddleware, telemetry=telemetry)
    if not any(getattr(r, "path", None) == METRICS_PATH for r in app.routes):
        app.add_route(METRICS_PATH, metrics_endpoint, methods=["GET"], include_in_schema=False)


async def metrics_endpoint(_: Request) -> Response:
    """Prometheus text exposition of this process' registry, OpenTelemetry metrics included."""
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def _process_state(service_name: str) -> _Process:
    global _process
    if _process is None:
        resource = _resource(service_name)
        tracer_provider = TracerProvider(resource=resource)
        meter_provider = MeterProvider(
            resource=resource,
            # Registers itself as a collector in prometheus_client's default REGISTRY.
            metric_readers=[PrometheusMetricReader()],
            views=[
                View(
                    instrument_name="http.server.request.duration",
                    aggregation=ExplicitBucketHistogramAggregation(DURATION_BUCKETS),
                )
            ],
        )
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        requests = meter_provider.get_meter(NAMESPACE).create_counter(
            "http.server.requests",  # exported as http_server_requests_total
            description="HTTP requests served, by service, method, route template and status.",
        )
        _process = _Process(tracer_provider, meter_provider, requests, exporting_to=set())
    return _process


def _resource(service_name: str) -> Resource:
    try:
        service_version = version("tuneloop")
    except PackageNotFoundError:  # a checkout that was never pip-installed
        service_version = "0.0.0+unknown"
    return Resource.create(
        {
            "service.name": service_name,
            "service.namespace": NAMESPACE,
            "service.version": service_version,
        }
    )


def _otlp_exporter(endpoint: str) -> SpanExporter:
    # Imported here: it pulls in protobuf and requests, which a process without a collector
    # does not need.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"  # settings hold the collector's base URL, e.g. http://collector:4318
    return OTLPSpanExporter(endpoint=url)


# --- redaction before export -------------------------------------------------------------------


class RedactingSpanExporter(SpanExporter):
    """Passes spans on with every string attribute (span and event) run through shared.redact.

    FastAPI records `url.query` as sent, and exception events carry messages that may quote an
    upstream URL or header; the trace store is storage, so secrets must not arrive there.
    """

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.exporter.export([_redacted_span(s) for s in spans])

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def _redacted_span(span: ReadableSpan) -> ReadableSpan:
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=_redacted_attributes(span.attributes),
        events=[
            Event(e.name, _redacted_attributes(e.attributes), e.timestamp) for e in span.events
        ],
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _redacted_attributes(attributes: Attributes) -> dict[str, Any]:
    return {key: _redacted_value(key, value) for key, value in (attributes or {}).items()}


def _redacted_value(key: str, value: Any) -> Any:
    if isinstance(value, str):
        if key == "url.query":
            return redact_url(f"?{value}")[1:]  # parsed as a query, so `key=`/`token=` count
        return redact_url(value) if key in ("url.full", "http.url") else redact_text(value)
    if isinstance(value, tuple | list) and value and isinstance(value[0], str):
        return tuple(redact_text(v) for v in value)
    return value


# --- request counter ---------------------------------------------------------------------------


class RequestMetricsMiddleware:
    """Counts each HTTP request by service, method, route template and final status."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == METRICS_PATH:
            await self.app(scope, receive, send)  # scrapes would drown real traffic
            return
        root_path = scope.get("root_path", "")
        status = 500  # what the client gets when the app raises before responding

        async def send_and_note_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            self._count(scope, root_path, status)

    def _count(self, scope: Scope, root_path: str, status: int) -> None:
        method = scope["method"] if scope["method"] in _METHODS else "_OTHER"
        labels = {
            "service": self.telemetry.service_name,
            "method": method,
            "route": _route_template(scope, root_path) or UNMATCHED_ROUTE,
            "status": str(status),
        }
        self.telemetry.requests.add(1, labels)


def _route_template(scope: Scope, root_path_before: str) -> str | None:
    """`/v1/jobs/{job_id}` rather than the raw path, so ids never become label values."""
    route = scope.get("route")
    template = getattr(route, "path_format", None)
    if not isinstance(template, str):
        return None  # nothing matched: the router's own 404
    # Routes inside a mounted sub-app know only their own part; routing grew root_path by the
    # mount prefixes on the way in. A Mount's own template already includes its path.
    prefix = str(scope.get("root_path", "")).removeprefix(root_path_before)
    if isinstance(route, Mount):
        prefix = prefix.removesuffix(route.path)
    return prefix + template
