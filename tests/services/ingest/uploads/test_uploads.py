"""Uploads through the running ingest service: OpenAI files API and the streamed import endpoint."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
from sqlmodel import Session

from services.ingest.models import UploadedFile
from services.ingest.uploads.files import file_errors_key, file_key
from shared import db
from shared.dev import localstack
from shared.storage import ObjectStore
from tests.services.ingest.conftest import UPLOAD_LIMIT, Edge

GOOD = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
SHAREGPT = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}
ALPACA = {"instruction": "Translate to French", "input": "cheese", "output": "fromage"}
BAD_ROLE = {
    "messages": [{"role": "robot", "content": "beep"}, {"role": "assistant", "content": "boop"}]
}


def _jsonl(*records: object) -> bytes:
    return b"".join(
        (r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records
    )


def test_files_api_upload_is_processed_with_a_report_naming_bad_lines(
    edge: Edge, tmp_path: Path
) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(_jsonl(GOOD, b"{not json", SHAREGPT, BAD_ROLE, ALPACA))
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    created = client.files.create(file=path.open("rb"), purpose="fine-tune")
    assert created.id.startswith("file-")
    assert created.bytes == path.stat().st_size
    assert created.status == "uploaded"  # as OpenAI answers, though it is already being worked

    def processed() -> bool:
        return client.files.retrieve(created.id).status == "processed"

    assert localstack.wait_until(processed, 30, interval_s=0.2)
    report = httpx.get(
        f"{edge.url}/v1/files/{created.id}", headers={"Authorization": f"Bearer {edge.key}"}
    ).json()["import_report"]
    assert report["accepted_lines"] == 3
    assert report["rejected_lines"] == 2
    reasons = {error["line"]: error["reason"] for error in report["errors"]}
    assert set(reasons) == {2, 4}
    assert "JSON" in reasons[2]
    assert "messages[0].role" in reasons[4]

    uploaded = edge.wait_for_samples(3, source="upload")
    refs = sorted(
        sample["source_ref"] for sample in uploaded if sample["source_ref"].startswith(created.id)
    )
    assert refs == [f"{created.id}:1", f"{created.id}:3", f"{created.id}:5"]
    # The row was written leased to the process that received the file: one attempt, no claim
    # by a sweep in between, and the lease given up with the outcome.
    engine = db.make_engine(edge.settings.database_url)
    with Session(engine) as session:
        row = session.get(UploadedFile, created.id)
    engine.dispose()
    assert row is not None
    assert (row.attempts, row.lease_owner, row.lease_expires_at) == (1, None, None)


def test_streamed_import_answers_with_the_report_and_is_idempotent(edge: Edge) -> None:
    headers = {"Authorization": f"Bearer {edge.key}", "content-type": "application/jsonl"}
    body = _jsonl(GOOD, SHAREGPT, {"nothing": "recognisable"})

    def chunks():  # sent in pieces that split lines, as a large upload would arrive
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    url = f"{edge.url}/v1/samples/import?import_id=batch-42"
    first = httpx.post(url, content=chunks(), headers=headers).json()
    assert first["accepted_lines"] == 2
    assert first["rejected_lines"] == 1
    assert first["errors"][0]["line"] == 3

    def refs(prefix: str) -> list[str]:
        found = edge.samples(source="upload", limit=1000)
        return sorted(s["source_ref"] for s in found if s["source_ref"].startswith(prefix))

    assert localstack.wait_until(lambda: len(refs("batch-42:")) == 2, 30)
    again = httpx.post(url, content=body, headers=headers).json()
    assert again["accepted_lines"] == 2
    # A later import, stored once the re-sent lines ahead of it on the stream have been.
    marker = f"{edge.url}/v1/samples/import?import_id=batch-43"
    assert httpx.post(marker, content=_jsonl(GOOD), headers=headers).json()["accepted_lines"] == 1
    assert localstack.wait_until(lambda: refs("batch-43:") == ["batch-43:1"], 30)
    assert refs("batch-42:") == ["batch-42:1", "batch-42:2"]  # the same two samples, once each


def test_an_evals_file_is_checked_not_imported_and_a_bad_line_is_named(edge: Edge) -> None:
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=edge.key, max_retries=0)
    # Eval items in OpenAI's eval file format; the second is chat-shaped, as a dataset's are.
    good = _jsonl({"item": {"question": "2+2?", "answer": "4"}}, {"item": GOOD},
                  {"item": {"question": "Hi"}, "sample": {"output_text": "Hello"}})  # fmt: skip
    bad = _jsonl({"item": {"q": 1}}, {"item": "2+2?"}, b"{not json")
    extra = _jsonl({"item": {"q": 1}, "answer": "4"})
    files = [client.files.create(file=("e.jsonl", body), purpose="evals") for body in (good, bad, extra)]  # fmt: skip
    assert [f.purpose for f in files] == ["evals"] * 3

    def checked() -> bool:
        return all(client.files.retrieve(f.id).status in ("processed", "error") for f in files)

    assert localstack.wait_until(checked, 30, interval_s=0.2)
    ok, refused, unknown = (client.files.retrieve(f.id) for f in files)
    assert (ok.status, ok.status_details) == ("processed", "3 eval items")
    assert (refused.status, refused.status_details) == (
        "error", 'line 2: "item": must be a JSON object (a str)')  # fmt: skip
    assert unknown.status == "error"
    assert unknown.status_details == (
        'line 1: \'answer\': unknown; a line holds "item" and, optionally, "sample"'
    )
    # Kept as uploaded, never imported: no sample was made from any line of them.
    content = httpx.get(f"{edge.url}/v1/files/{ok.id}/content",
                        headers={"Authorization": f"Bearer {edge.key}"})  # fmt: skip
    assert content.content == good
    made = edge.samples(source="upload", limit=1000)
    assert not [s for s in made if s["source_ref"].split(":")[0] in {f.id for f in files}]


def test_upload_refusals_name_the_field(edge: Edge, tmp_path: Path) -> None:
    auth = {"Authorization": f"Bearer {edge.key}"}
    files = {"file": ("a.jsonl", _jsonl(GOOD), "application/jsonl")}
    purpose = httpx.post(
        f"{edge.url}/v1/files", files=files, data={"purpose": "batch"}, headers=auth
    )
    assert purpose.status_code == 400
    assert "purpose" in purpose.json()["detail"]
    fmt = httpx.post(f"{edge.url}/v1/samples/import?format=csv", content=b"x", headers=auth)
    assert fmt.status_code == 400
    assert "format" in fmt.json()["detail"]
    created = httpx.post(
        f"{edge.url}/v1/files", files=files, data={"purpose": "fine-tune"}, headers=auth
    ).json()
    other = httpx.get(
        f"{edge.url}/v1/files/{created['id']}",
        headers={"Authorization": f"Bearer {edge.other_key}"},
    )
    assert other.status_code == 404
    assert (
        httpx.post(f"{edge.url}/v1/files", files=files, data={"purpose": "fine-tune"}).status_code
        == 401
    )


def _status_of_raw_post(url: str, headers: dict[str, str], chunks: Iterable[bytes]) -> str:
    """POST /v1/files on a socket of our own: send the headers and `chunks`, then read the
    status line, however much of the declared body was sent."""
    parts = urlsplit(url)
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection((parts.hostname, parts.port), timeout=15) as sock:
        sock.sendall(f"POST /v1/files HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}\r\n".encode())
        for chunk in chunks:
            sock.sendall(chunk)
        return sock.makefile("rb").readline().decode().strip()


def test_files_api_checks_the_key_before_reading_the_body_and_caps_its_size(edge: Edge) -> None:
    form = {"content-type": "multipart/form-data; boundary=b0undary"}
    start = b"--b0undary\r\nContent-Disposition: form-data; name=file; filename=a.jsonl\r\n\r\n"
    # No key, a body declared under the limit and only its first bytes sent: refused at once
    # (a form read before the key was checked would leave this waiting for the rest).
    declared = {"content-length": str(UPLOAD_LIMIT // 2)}
    assert _status_of_raw_post(edge.url, form | declared, [start]) == "HTTP/1.1 401 Unauthorized"
    key = {"authorization": f"Bearer {edge.key}"}
    # Declared over the limit: 413 before any of it is read.
    over = {"content-length": str(UPLOAD_LIMIT + 1)}
    assert _status_of_raw_post(edge.url, form | key | over, [start]).startswith("HTTP/1.1 413")
    # Not declared (chunked): read until it passes the limit, then 413.
    line = _jsonl(GOOD)
    chunk = start + line * (64 * 1024 // len(line))
    chunked = {"transfer-encoding": "chunked"}
    framed = (b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(UPLOAD_LIMIT // len(chunk) + 2))
    assert _status_of_raw_post(edge.url, form | key | chunked, framed).startswith("HTTP/1.1 413")
    # The refusals say which limit, in the API's error shape.
    too_big = httpx.post(
        f"{edge.url}/v1/files",
        files={"file": ("big.jsonl", line * (UPLOAD_LIMIT // len(line) + 1), "application/jsonl")},
        data={"purpose": "fine-tune"},
        headers={"Authorization": f"Bearer {edge.key}"},
    )
    assert too_big.status_code == 413
    assert (
        too_big.json()["detail"]
        == f"file: the body is over the upload limit of {UPLOAD_LIMIT} bytes"
    )
    # A form without its file or purpose names the missing field.
    no_file = httpx.post(f"{edge.url}/v1/files", data={"purpose": "fine-tune"}, headers=key)
    assert (no_file.status_code, no_file.json()["detail"]) == (
        400,
        "file: required, as a file part of the form",
    )
    no_purpose = httpx.post(
        f"{edge.url}/v1/files", files={"file": ("a.jsonl", line, "application/jsonl")}, headers=key
    )
    assert (no_purpose.status_code, no_purpose.json()["detail"]) == (
        400,
        "purpose: required form field is missing",
    )


def test_every_rejected_line_is_listed_beyond_the_reports_first_thousand(edge: Edge) -> None:
    """1,003 bad lines among good ones: the report lists the first 1,000 and points at the
    complete list, for a file and for a streamed import; the file comes back as uploaded and,
    deleted, is gone for good. Another tenant sees none of it."""
    body = _jsonl(GOOD, *([BAD_ROLE] * 1002), ALPACA, b"{not json")
    key = {"Authorization": f"Bearer {edge.key}"}
    created = httpx.post(
        f"{edge.url}/v1/files",
        files={"file": ("many.jsonl", body, "application/jsonl")},
        data={"purpose": "fine-tune"},
        headers=key,
    ).json()
    url = f"{edge.url}/v1/files/{created['id']}"

    def processed() -> bool:
        return httpx.get(url, headers=key).json()["status"] == "processed"

    assert localstack.wait_until(processed, 60, interval_s=0.3)
    report = httpx.get(url, headers=key).json()["import_report"]
    assert (report["accepted_lines"], report["rejected_lines"]) == (2, 1003)
    assert (len(report["errors"]), report["errors_truncated"]) == (1000, True)
    assert report["errors_url"] == f"/v1/files/{created['id']}/errors"
    listed = httpx.get(f"{edge.url}{report['errors_url']}", headers=key)
    assert listed.status_code == 200
    assert listed.headers["content-type"].startswith("application/jsonl")
    every = [json.loads(line) for line in listed.text.splitlines()]
    assert [e["line"] for e in every] == [*range(2, 1004), 1005]
    assert every[:1000] == report["errors"]
    assert "messages[0].role" in every[1001]["reason"]
    assert "JSON" in every[-1]["reason"]

    content = httpx.get(f"{url}/content", headers=key)
    assert (content.status_code, content.content) == (200, body)
    assert content.headers["content-length"] == str(len(body))
    assert content.headers["content-disposition"] == "attachment; filename*=utf-8''many.jsonl"
    # The local copies the downloads were streamed from are gone.
    spool = edge.settings.app.data_dir.resolve() / "ingest" / "uploads"
    assert sorted(spool.glob("*.upload")) == []
    other = {"Authorization": f"Bearer {edge.other_key}"}
    for path in ("", "/content", "/errors"):
        assert httpx.get(f"{url}{path}", headers=other).status_code == 404
    assert httpx.delete(url, headers=other).status_code == 404
    store = ObjectStore.from_settings(edge.settings.s3)
    objects = (file_key("acme", created["id"]), file_errors_key("acme", created["id"]))
    assert all(store.exists(stored) for stored in objects)
    deleted = httpx.delete(url, headers=key)
    assert deleted.json() == {"id": created["id"], "object": "file", "deleted": True}
    for path in ("", "/content", "/errors"):
        assert httpx.get(f"{url}{path}", headers=key).status_code == 404
    assert not any(store.exists(stored) for stored in objects)  # they went with the row
    assert created["id"] not in [
        f["id"] for f in httpx.get(f"{edge.url}/v1/files", headers=key).json()["data"]
    ]

    imported = httpx.post(
        f"{edge.url}/v1/samples/import?import_id=many-bad", content=body, headers=key
    ).json()
    assert (imported["rejected_lines"], len(imported["errors"])) == (1003, 1000)
    assert imported["errors_url"] == "/v1/samples/imports/many-bad/errors"
    listed = httpx.get(f"{edge.url}{imported['errors_url']}", headers=key)
    assert [json.loads(line)["line"] for line in listed.text.splitlines()] == [
        *range(2, 1004),
        1005,
    ]
    assert httpx.get(f"{edge.url}{imported['errors_url']}", headers=other).status_code == 404
    assert (
        httpx.get(f"{edge.url}/v1/samples/imports/nothing-here/errors", headers=key).status_code
        == 404
    )
