"""From captured bytes to an Exchange: encodings, SSE, Gemini's JSON-array stream, spill records."""

from __future__ import annotations

import gzip
import json
import os
import stat
import time
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psutil
import pytest

from services.ingest.capture.call import CapturedCall, gateway_sample_id, to_exchange
from services.ingest.capture.fidelity import Fidelity
from services.ingest.capture.spill import SpillFile
from services.ingest.normalize import NormalizeError, normalize
from shared.processes import Incarnation, start_mark, this_incarnation
from tests.fakes.upstream import recorded


def _call(
    api: str, request: object, body: bytes, content_type: str, encoding: str = ""
) -> CapturedCall:
    return CapturedCall(
        api=api,  # type: ignore[arg-type]
        tenant="acme",
        request_id="req-1",
        request_body=json.dumps(request).encode(),
        status=200,
        response_body=body,
        content_type=content_type,
        content_encoding=encoding,
        started_at=datetime.now(UTC),
        latency_ms=12.5,
        model_from_path="gemini-2.0-flash" if api == "gemini" else None,
    )


def test_gzip_response_is_decoded_for_capture() -> None:
    exchange = recorded("an03_parallel_tool_use_gzip")
    body = gzip.compress(json.dumps(exchange["response"]["body"]).encode())
    result = to_exchange(
        _call("anthropic", exchange["request"]["body"], body, "application/json", "gzip")
    )
    assert result.response == exchange["response"]["body"]
    assert result.source_ref == "req-1"


def test_sse_is_passed_as_stream_text() -> None:
    exchange = recorded("oa03_streaming_parallel_tool_calls_sse")
    body = exchange["response"]["body"].encode()
    result = to_exchange(
        _call("openai", exchange["request"]["body"], body, "text/event-stream; charset=utf-8")
    )
    assert result.stream == exchange["response"]["body"]
    assert result.response is None


def test_gemini_stream_without_sse_is_one_json_array_and_still_normalises() -> None:
    exchange = recorded("ge04_genai_inlineData_urlsafe_b64_sse")
    chunks = [
        json.loads(line[5:])
        for line in exchange["response"]["body"].splitlines()
        if line.startswith("data:")
    ]
    call = _call(
        "gemini", exchange["request"]["body"], json.dumps(chunks).encode(), "application/json"
    )
    result = to_exchange(call)
    assert result.stream is not None
    [sample] = normalize(result).samples
    assert sample.completion() is not None
    assert "checkerboard" in sample.completion().text()  # type: ignore[union-attr]


def test_the_id_the_gateway_announces_is_the_id_its_journaled_call_becomes() -> None:
    # x-tuneloop-sample-id is sent before the call is read; the sample made from the journal
    # line, after a round trip through it, must carry that id (as must its first choice only).
    for name, api, content_type in (
        ("oa01_tool_calls_multiturn", "openai", "application/json"),
        ("oa03_streaming_parallel_tool_calls_sse", "openai", "text/event-stream"),
        ("an03_parallel_tool_use_gzip", "anthropic", "application/json"),
    ):
        exchange = recorded(name)
        body = exchange["response"]["body"]
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        call = _call(api, exchange["request"]["body"], raw, content_type)
        call.request_id = os.urandom(16).hex()
        journaled = CapturedCall.from_record(orjson.loads(orjson.dumps(call.to_record())))
        [sample] = normalize(to_exchange(journaled)).samples
        assert sample.id == gateway_sample_id("acme", call.request_id), name
    assert gateway_sample_id("acme", "req-1") != gateway_sample_id("globex", "req-1")


def test_unreadable_request_is_a_normalize_error_naming_it() -> None:
    call = _call("openai", {}, b"{}", "application/json")
    call.request_body = b"\xff not json"
    with pytest.raises(NormalizeError, match="request"):
        to_exchange(call)


def test_spill_records_round_trip_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    spill = SpillFile(tmp_path / "spill.jsonl")
    call = _call("openai", {"model": "gpt-4o-mini"}, b"\x00\x01binary", "application/json")
    spill.append("call", call.to_record())
    with spill.path.open("ab") as handle:
        handle.write(b'{"kind": "call", "payl')  # the process died mid-write
    [claimed] = spill.claim()
    records = list(spill.records(claimed))
    assert len(records) == 1
    assert CapturedCall.from_record(records[0]["payload"]) == call
    assert not spill.path.exists()


def test_a_record_carries_every_field_of_the_call() -> None:
    call = _call("gemini", {"contents": []}, b"{}", "application/json")
    call.ttft_ms, call.tags = 3.5, ["nightly", "eu"]
    assert set(call.to_record()) == {f.name for f in fields(CapturedCall)}
    assert CapturedCall.from_record(orjson.loads(orjson.dumps(call.to_record()))) == call


def test_a_responses_call_is_read_as_one_and_older_records_as_chat() -> None:
    request = {"model": "gpt-4.1", "input": "Hi"}
    answer = {
        "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4.1",
        "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello!"}]}],
    }  # fmt: skip
    call = _call("openai", request, json.dumps(answer).encode(), "application/json")
    call.path = "/v1/responses"
    [sample] = normalize(to_exchange(call)).samples
    assert [(m.role, m.text()) for m in sample.messages] == [
        ("user", "Hi"),
        ("assistant", "Hello!"),
    ]
    # A journal line written before calls had a path: read as the provider's chat format.
    chat = _call("openai", {"model": "gpt-4o-mini", "messages": []}, b"{}", "application/json")
    record = {k: v for k, v in chat.to_record().items() if k != "path"}
    assert CapturedCall.from_record(record).path == ""
    assert to_exchange(CapturedCall.from_record(record)).api_path is None


def test_a_claim_of_a_live_sibling_process_is_left_to_it_and_a_gone_ones_is_taken(
    tmp_path: Path,
) -> None:
    spill = SpillFile(tmp_path / "spill.jsonl")
    record = {"kind": "call", "payload": {}}
    parent = psutil.Process(os.getppid())  # pytest's parent: alive
    sibling_run = Incarnation(parent.pid, start_mark(parent.pid) or "")
    claims = {
        "sibling": tmp_path / f"spill.jsonl.replaying-{sibling_run.name}-1",
        # The same pid, another start: the sibling's pid reused after it died.
        "reused": tmp_path / f"spill.jsonl.replaying-{parent.pid}.1-2",
        "dead": tmp_path / f"spill.jsonl.replaying-{2**22 + 777}.1-3",  # above pid_max
        "older version": tmp_path / f"spill.jsonl.replaying-{os.getppid()}-4",  # pid only
    }
    for path in claims.values():
        path.write_bytes(orjson.dumps(record) + b"\n")
    spill.append("sample", {"id": "s-1"})
    claimed = spill.claim()
    assert {name for name, path in claims.items() if path in claimed} == {
        "reused",
        "dead",
        "older version",
    }
    [mine] = [p for p in claimed if p not in claims.values()]
    assert f".replaying-{this_incarnation().name}-" in mine.name
    assert list(spill.records(mine)) == [{"kind": "sample", "payload": {"id": "s-1"}}]
    mine.unlink()
    assert list(spill.records(mine)) == []  # gone (replayed by someone else): nothing, no error


def test_the_spill_file_refuses_records_past_its_cap_except_those_a_replay_writes_back(
    tmp_path: Path,
) -> None:
    spill = SpillFile(tmp_path / "spill.jsonl", max_bytes=4096)
    payload = {"text": "x" * 900}
    kept = sum(spill.append("sample", payload) for _ in range(10))
    assert kept == 4  # ~930 bytes a line
    assert spill.used() <= 4096
    # Claimed (being replayed) still counts: renaming it aside frees nothing.
    [claimed] = spill.claim()
    assert not spill.append("sample", payload)
    with SpillFile.readmitting():  # a replayed record that failed again takes its own place
        assert spill.append("sample", payload)
    claimed.unlink()
    time.sleep(0.6)  # the size is looked up again every half second
    assert spill.append("sample", payload)


def test_spill_and_held_files_are_0600_in_a_0700_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ingest"
    folder.mkdir(mode=0o755)
    spill = SpillFile(folder / "capture-spill.jsonl")
    spill.append("sample", {"id": "s-1"})
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(spill.path.stat().st_mode) == 0o600


def test_fidelity_reports_per_source_and_bounds_distinct_reasons() -> None:
    fidelity = Fidelity()
    fidelity.samples[("acme", "gateway")] += 2
    fidelity.count_rejected("acme", "upload", "messages[0].role: 'robot'")
    fidelity.count_dropped("globex", "otlp", "ignored")
    report = fidelity.report("acme")
    assert report == {
        "gateway": {"samples": 2, "rejected": {}, "dropped": {}},
        "upload": {"samples": 0, "rejected": {"messages[0].role: 'robot'": 1}, "dropped": {}},
    }
