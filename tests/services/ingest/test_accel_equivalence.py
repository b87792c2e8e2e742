"""The compiled OTLP path (shared.accel) gives exactly what the source gives: the same events,
rejections, notes and errors, for every OTLP fixture, the benchmark's agent traces and broken
bodies. The rest of the suite runs compiled too when the build is current; this compares the
two side by side, the source run in a process with TUNELOOP_ACCEL=0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from services.ingest.otlp.export import OtlpDecodeError
from services.ingest.otlp.workers import map_export
from shared import accel
from tests.benchmarks.otlp_traces import TraceFactory, export_bodies
from tests.services.ingest.otlp.test_genai_spans import otlp_fixture_files
from tests.services.ingest.otlp.test_otlp import JSON, PROTO, fixture_body

ROOT = Path(__file__).resolve().parents[3]
BROKEN = [
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', JSON),
    (b'{"resourceSpans": 5}', JSON),
    (b'{"resourceSpans": [', JSON),
    (b"\x0a\x05\x0a\x03\x0a\x01", PROTO),
]


def _inputs() -> list[tuple[str, bytes, str]]:
    inputs = [(path.name, *fixture_body(path)) for path in otlp_fixture_files()]
    for encoding, content_type in (("json", JSON), ("protobuf", PROTO)):
        bodies = export_bodies(TraceFactory(), requests=2, traces_per_request=3, encoding=encoding)
        inputs += [(f"bench-{encoding}-{i}", body, content_type) for i, body in enumerate(bodies)]
    return inputs + [(f"broken-{i}", body, ct) for i, (body, ct) in enumerate(BROKEN)]


def _outcome(body: bytes, content_type: str) -> object:
    try:
        mapped = map_export(body, content_type, None, "acme")
    except OtlpDecodeError as exc:
        return ["error", type(exc).__name__, str(exc)]
    events = []
    for prepared in mapped.prepared:
        event = orjson.loads(prepared.event.payload)
        del event["occurred_at"]  # the time of this run
        events.append([prepared.sample_id, prepared.event.subject, event])
    samples = [sample.model_dump(mode="json") for sample in mapped.with_media]
    return [
        "ok",
        events,
        samples,
        [repr(r) for r in mapped.rejected],
        [repr(d) for d in mapped.dropped],
    ]


def outcomes() -> bytes:
    """Every input's outcome, as JSON (what the source-run process prints)."""
    return orjson.dumps({name: _outcome(body, ct) for name, body, ct in _inputs()})


def test_compiled_mapping_matches_the_source() -> None:
    compiled_here = [accel.is_compiled(sys.modules[name]) for name in accel.MODULES]
    if not all(compiled_here):
        pytest.skip(f"the OTLP modules run from source here: {accel.status().describe()}")
    compiled = orjson.loads(outcomes())
    code = "import sys; from tests.services.ingest.test_accel_equivalence import outcomes; "
    code += "sys.stdout.buffer.write(outcomes())"
    env = {**os.environ, accel.ENV_SWITCH: "0"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=120
    )
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    source = orjson.loads(run.stdout)
    assert len(compiled) > 10
    assert compiled.keys() == source.keys()
    for name in compiled:
        assert compiled[name] == source[name], name
    assert any(outcome[0] == "error" for outcome in compiled.values())
    assert sum(len(outcome[1]) for outcome in compiled.values() if outcome[0] == "ok") > 6
