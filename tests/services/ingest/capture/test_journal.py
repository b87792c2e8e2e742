"""The capture journal: segments named by the writer's incarnation, files only its user may read."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path

from services.ingest.capture.call import CapturedCall
from services.ingest.capture.journal import Journal, SegmentName
from shared.processes import Incarnation, this_incarnation


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


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_segments_are_named_by_the_writers_pid_and_start_and_rotate_by_count(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path, segment_records=2)
    for n in range(3):  # the third opens a second segment
        journal.append(_call(n))
    journal.close()
    me = this_incarnation()
    assert sorted(p.name for p in tmp_path.glob("*.jsonl")) == [
        f"{me.pid}.{me.mark}-0.jsonl",
        f"{me.pid}.{me.mark}-1.jsonl",
    ]
    assert me.mark == str(int(me.mark))  # on Linux: the kernel's start time, not a random id


def test_segment_names_are_read_and_other_files_ignored(tmp_path: Path) -> None:
    assert SegmentName.parse(tmp_path / "123.456-4.jsonl") == SegmentName(
        Incarnation(123, "456"), 4
    )
    assert SegmentName.parse(tmp_path / "123-4.jsonl") == SegmentName(None, 4)  # an older writer's
    assert SegmentName.parse(tmp_path / "123.456-4.jsonl.shipped") is None
    assert SegmentName.parse(tmp_path / "123-adopted-9-1.jsonl") is None
    assert SegmentName.parse(tmp_path / ".shipper.lock") is None


def test_a_writer_under_a_reused_pid_writes_files_of_its_own(tmp_path: Path) -> None:
    # A container restarts its process under the same pid: the old writer's segment 0 must
    # neither be appended to nor taken for the new one's.
    old = Journal(tmp_path, writer=Incarnation(1, "1000"))
    old.append(_call(1))
    new = Journal(tmp_path, writer=Incarnation(1, "2000"))
    new.append(_call(2))
    assert old.path(0) != new.path(0)
    assert len(old.path(0).read_bytes().splitlines()) == 1
    assert len(new.path(0).read_bytes().splitlines()) == 1


def test_journal_files_are_0600_in_a_0700_folder_whatever_the_umask(tmp_path: Path) -> None:
    loose = tmp_path / "journal"
    loose.mkdir(mode=0o755)  # left by an earlier version
    previous = os.umask(0o022)
    try:
        journal = Journal(loose)
        journal.append(_call(1))
    finally:
        os.umask(previous)
    assert _mode(loose) == 0o700
    [segment] = loose.glob("*.jsonl")
    assert _mode(segment) == 0o600


def test_an_incarnation_is_alive_only_while_that_run_of_the_pid_is() -> None:
    me = this_incarnation()
    assert me.alive()
    assert not Incarnation(me.pid, str(int(me.mark) + 1)).alive()  # same pid, another start
    assert not Incarnation(2**22 + 12345, me.mark).alive()  # above pid_max: no such process
    assert Incarnation.parse(me.name) == me
    assert Incarnation.parse("123") is None
