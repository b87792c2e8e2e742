"""shared.telemetry: request metrics by route template on /metrics, a server span per request,
and spans exported over OTLP/HTTP with secrets redacted."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from shared.telemetry import METRICS_PATH, RequestMetricsMiddleware, setup_telemetry


def build_app(service: str) -> FastAPI:
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def get_item(item_id: int) -> dict[str, int]:
        if item_id == 404:
            raise HTTPException(status_code=404, detail="no such item")
        return {"item_id": item_id}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("handler failed")

    setup_telemetry(service, app=app)
    return app


@pytest.fixture
def service() -> str:
    # Metrics are process-wide and cumulative: a fresh service label keeps tests independent.
    return f"svc-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def spans(service: str) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    setup_telemetry(service).tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


def request_count(client: TestClient, **labels: str) -> float:
    """The value of http_server_requests_total for exactly these labels (0 when absent)."""
    response = client.get(METRICS_PATH)
    assert response.status_code == 200
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "http_server_requests_total" and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return sample.value
    return 0.0


def test_metrics_endpoint_counts_requests_by_route_template(service: str) -> None:
    client = TestClient(build_app(service))
    assert client.get("/items/42").status_code == 200
    assert client.get("/items/43").status_code == 200

    response = client.get(METRICS_PATH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    labels = {"service": service, "method": "GET", "route": "/items/{item_id}", "status": "200"}
    assert request_count(client, **labels) == 2
    # Raw paths never become label values, and scrapes are not counted.
    assert "/items/42" not in response.text
    assert request_count(client, service=service, route=METRICS_PATH) == 0


def test_duration_histogram_by_route_with_long_buckets(service: str) -> None:
    client = TestClient(build_app(service))
    client.get("/items/1")
    durations = [
        sample
        for family in text_string_to_metric_families(client.get(METRICS_PATH).text)
        for sample in family.samples
        if sample.name == "http_server_request_duration_seconds_bucket"
        and sample.labels.get("http_route") == "/items/{item_id}"
    ]
    # LLM calls outlast FastAPI's default 10 s top bucket; ours goes to 300 s.
    assert {60.0, 300.0} <= {float(s.labels["le"]) for s in durations}
    assert all(s.value >= 1 for s in durations if s.labels["le"] == "+Inf")


def test_status_labels_for_client_errors_server_errors_and_unmatched_paths(service: str) -> None:
    client = TestClient(build_app(service), raise_server_exceptions=False)
    assert client.get("/items/404").status_code == 404
    assert client.get("/boom").status_code == 500
    assert client.get("/no/such/path/123").status_code == 404

    assert request_count(client, service=service, route="/items/{item_id}", status="404") == 1
    assert request_count(client, service=service, route="/boom", status="500") == 1
    assert request_count(client, service=service, route="unmatched", status="404") == 1
    assert "/no/such/path" not in client.get(METRICS_PATH).text


def server_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]


def test_server_span_per_request(service: str, spans: InMemorySpanExporter) -> None:
    client = TestClient(build_app(service))
    parent_trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    client.get("/items/7", headers={"traceparent": f"00-{parent_trace_id}-00f067aa0ba902b7-01"})

    [span] = server_spans(spans)
    assert span.name == "GET /items/{item_id}"
    assert span.attributes is not None
    assert span.attributes["http.route"] == "/items/{item_id}"
    assert span.attributes["http.request.method"] == "GET"
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["url.path"] == "/items/7"
    assert span.resource.attributes["service.namespace"] == "tuneloop"
    assert "service.name" in span.resource.attributes
    assert "service.version" in span.resource.attributes
    # The caller's W3C traceparent makes this span part of the caller's trace.
    assert span.context is not None
    assert f"{span.context.trace_id:032x}" == parent_trace_id


def test_failed_request_span_is_an_error(service: str, spans: InMemorySpanExporter) -> None:
    client = TestClient(build_app(service), raise_server_exceptions=False)
    client.get("/boom")
    client.get("/items/404")

    by_status = {s.attributes["http.response.status_code"]: s for s in server_spans(spans)}  # type: ignore[index]
    assert by_status[500].status.status_code is StatusCode.ERROR
    assert by_status[404].status.status_code is StatusCode.UNSET  # the client's error


def test_setup_twice_is_idempotent(service: str) -> None:
    app = build_app(service)
    global_provider = trace.get_tracer_provider()
    again = setup_telemetry(service, app=app)
    other = setup_telemetry(f"{service}-other", app=FastAPI())

    factories: list[object] = [m.cls for m in app.user_middleware]
    assert factories.count(RequestMetricsMiddleware) == 1
    assert [getattr(r, "path", None) for r in app.routes].count(METRICS_PATH) == 1
    assert trace.get_tracer_provider() is global_provider is again.tracer_provider
    assert other.meter_provider is again.meter_provider

    client = TestClient(app)
    client.get("/items/1")
    assert request_count(client, service=service, route="/items/{item_id}", status="200") == 1
    exposition = client.get(METRICS_PATH).text
    # One family per metric name: a second reader or instrument would break Prometheus' parser.
    assert exposition.count("# TYPE http_server_requests_total counter") == 1
    assert exposition.count("# TYPE http_server_request_duration_seconds histogram") == 1


class _Collector(BaseHTTPRequestHandler):
    """A stand-in OTLP/HTTP collector that keeps what it receives."""

    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass


@pytest.fixture(scope="module")
def collector_url() -> str:
    # Left running until the process ends: the exporter stays attached to the process-wide
    # provider, and spans from later tests must not meet a closed port at shutdown.
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}"


def exported_spans() -> list[tuple[str, Span]]:
    """(path, span) for every span the collector received."""
    found: list[tuple[str, Span]] = []
    for path, content_type, body in _Collector.received:
        assert content_type == "application/x-protobuf"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                found.extend((path, span) for span in scope_spans.spans)
    return found


def test_spans_are_exported_over_otlp_http_with_secrets_redacted(
    service: str, collector_url: str
) -> None:
    telemetry = setup_telemetry(service, otlp_endpoint=collector_url)
    setup_telemetry(service, otlp_endpoint=collector_url)  # must not add a second exporter
    secret = "AIzaSyD3m0Xk9_Q-abcdefghijklmnopqrstuvw"
    with telemetry.tracer.start_as_current_span(f"{service}.step") as span:
        span.set_attribute("url.query", f"token=plain-token&key={secret}&alt=json")
        span.add_event("retry", {"reason": f"upstream refused Authorization: Bearer {secret}"})
    assert telemetry.tracer_provider.force_flush(timeout_millis=10_000)

    [(path, exported)] = [(p, s) for p, s in exported_spans() if s.name == f"{service}.step"]
    assert path == "/v1/traces"
    attributes = {a.key: a.value.string_value for a in exported.attributes}
    assert attributes["url.query"] == "token=[REDACTED]&key=[REDACTED]&alt=json"
    [event] = exported.events
    assert (
        event.attributes[0].value.string_value
        == "upstream refused Authorization: Bearer [REDACTED]"
    )
    assert all(secret.encode() not in body for _, _, body in _Collector.received)
