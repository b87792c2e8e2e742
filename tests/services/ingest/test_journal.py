"""The capture journal: segments go when their calls are done; a dead process's segments come back."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson

from services.ingest.capture import CapturedCall
from services.ingest.journal import Journal


def _call(n: int) -> CapturedCall:
    return CapturedCall(
        api="openai",
        tenant="acme",
        request_id=f"req-{n}",
        request_body=b'{"model": "gpt-4o-mini"}',
        status=200,
        response_body=b"{}",
        content_type="application/json",
        content_encoding="",
        started_at=datetime.now(UTC),
        latency_ms=1.0,
    )


def test_a_closed_segment_is_deleted_once_its_calls_are_done(tmp_path: Path) -> None:
    journal = Journal(tmp_path, segment_records=2)
    tickets = [journal.append(_call(n)) for n in range(3)]  # the third opens a second segment
    assert tickets == [0, 0, 1]
    assert len(list(tmp_path.glob("*.jsonl"))) == 2
    journal.done(tickets[0])
    assert len(list(tmp_path.glob("*.jsonl"))) == 2  # one call of segment 0 still pending
    journal.done(tickets[1])
    assert [p.name.split("-")[1] for p in tmp_path.glob("*.jsonl")] == ["1.jsonl"]
    journal.done(tickets[2])
    journal.close()
    assert list(tmp_path.glob("*.jsonl")) == []


def test_segments_of_a_dead_process_are_orphans_with_their_calls(tmp_path: Path) -> None:
    dead_pid = 2**22 + 12345  # above pid_max on Linux: no such process
    orphan = tmp_path / f"{dead_pid}-0.jsonl"
    writer = Journal(tmp_path / "other")
    writer.append(_call(1))
    writer.append(_call(2))
    (tmp_path / "other" / f"{writer._pid}-0.jsonl").rename(orphan)
    with orphan.open("ab") as handle:
        handle.write(b'{"api": "openai", "ten')  # killed mid-write
    journal = Journal(tmp_path)
    assert journal.orphans() == [orphan]
    assert [call.request_id for call in journal.calls(orphan)] == ["req-1", "req-2"]
    # The live journal's own open segment is never handed back.
    assert not any(path.name.startswith(f"{journal._pid}-") for path in journal.orphans())


def test_an_orphan_is_adopted_by_one_process_and_is_an_orphan_again_if_that_one_dies(
    tmp_path: Path,
) -> None:
    dead_pid = 2**22 + 12346
    orphan = tmp_path / f"{dead_pid}-0.jsonl"
    orphan.write_bytes(orjson.dumps(_call(1).to_record()) + b"\n")
    journal = Journal(tmp_path)
    adopted = journal.adopt(orphan)
    assert adopted is not None
    assert adopted.name.startswith(f"{journal._pid}-adopted-")
    # A sibling worker looking at the same directory finds nothing left to recover...
    assert journal.adopt(orphan) is None
    assert orphan not in journal.orphans()
    assert adopted not in journal.orphans()
    assert [call.request_id for call in journal.calls(adopted)] == ["req-1"]
    # ...and if the adopter dies before finishing, its adopted segment is an orphan for the next.
    dead_adopted = adopted.rename(tmp_path / f"{dead_pid + 1}-adopted-{orphan.name}")
    assert journal.orphans() == [dead_adopted]
