"""The compiled OTLP path (services.ingest.accel) gives exactly what the source gives: the same
events, rejections, notes and errors, for every OTLP fixture, the benchmark's agent traces and
broken bodies. Two processes side by side, one opted in (TUNELOOP_INGEST_ACCEL=1), one not; and
an OTLP pool process of an opted-in service (spawned, as ExportMapper's are) runs compiled too."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson
import pytest

from services.ingest import accel
from services.ingest.otlp.export import OtlpDecodeError
from services.ingest.otlp.workers import map_export
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
    """Every input's outcome, and which listed modules this process runs compiled, as JSON (what
    each process prints)."""
    compiled = {name: accel.is_compiled(sys.modules[name]) for name in accel.MODULES}
    return orjson.dumps(
        {
            "compiled": compiled,
            "status": accel.status().describe(),
            "outcomes": {name: _outcome(body, ct) for name, body, ct in _inputs()},
        }
    )


def _run(opt_in: str) -> dict[str, object]:
    code = "import sys; from tests.services.ingest.test_accel_equivalence import outcomes; "
    code += "sys.stdout.buffer.write(outcomes())"
    env = {**os.environ, accel.OPT_IN: opt_in}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, timeout=120
    )
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    result: dict[str, object] = orjson.loads(run.stdout)
    return result


def test_compiled_mapping_matches_the_source() -> None:
    opted_in = _run("1")
    if not all(opted_in["compiled"].values()):  # type: ignore[attr-defined]
        pytest.skip(f"no compiled OTLP modules here: {opted_in['status']}")
    from_source = _run("0")
    assert not any(from_source["compiled"].values())  # type: ignore[attr-defined]
    compiled, source = opted_in["outcomes"], from_source["outcomes"]
    assert isinstance(compiled, dict)
    assert isinstance(source, dict)
    assert len(compiled) > 10
    assert compiled.keys() == source.keys()
    for name in compiled:
        assert compiled[name] == source[name], name
    assert any(outcome[0] == "error" for outcome in compiled.values())
    assert sum(len(outcome[1]) for outcome in compiled.values() if outcome[0] == "ok") > 6


def compiled_modules() -> dict[str, bool]:
    """Run in a pool process: which listed modules it imported compiled."""
    return {name: accel.is_compiled(sys.modules[name]) for name in accel.MODULES}


def test_an_opted_in_pool_process_runs_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawned pool process imports its function's module (as ExportMapper's import
    map_export's), and with it services.ingest, which puts the finder first."""
    build = accel.finder_for(accel.DEFAULT_DIR)
    if isinstance(build, str):
        pytest.skip(build)
    monkeypatch.setenv(accel.OPT_IN, "1")  # a spawned process starts with this environment
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        compiled = pool.submit(compiled_modules).result(timeout=120)
    assert all(compiled.values()), compiled
