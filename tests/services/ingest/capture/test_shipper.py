"""The journal shipper: it tails the gateway's journal, ships whole lines only, resumes where it
stopped, deletes what is closed and shipped (and only that, whatever pid a new writer has), and
works a directory alone. The flow through real processes is in test_shipper_process.py."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.ingest.capture.call import CapturedCall
from services.ingest.capture.journal import Journal
from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.capture.shipper import OFFSET_SUFFIX, JournalShipper, read_batch
from services.ingest.capture.spill import SpillFile
from shared.events import SampleCaptured
from shared.processes import Incarnation, this_incarnation
from tests.fakes.upstream import recorded
from tests.plugins.infra import dead_pid


def _call(n: int) -> CapturedCall:
    exchange = recorded("oa01_tool_calls_multiturn")
    return CapturedCall(
        api="openai",
        tenant="acme",
        request_id=f"req-{n}",
        request_body=json.dumps(exchange["request"]["body"]).encode(),
        status=200,
        response_body=json.dumps(exchange["response"]["body"]).encode(),
        content_type="application/json",
        content_encoding="",
        started_at=datetime.now(UTC),
        latency_ms=3.0,
    )


class Shipped:
    """What the shipper's pipeline published, by request id (the sample's source_ref)."""

    def __init__(self) -> None:
        self.refs: list[str] = []

    async def publish(self, event: SampleCaptured) -> None:
        assert event.sample is not None
        self.refs.append(str(event.sample.source_ref))


def _shipper(
    journal_dir: Path,
    tmp_path: Path,
    shipped: Shipped,
    alive: Callable[[Incarnation], bool] = Incarnation.alive,
) -> JournalShipper:
    pipeline = CapturePipeline(
        publish=shipped.publish,
        store=None,
        spill=SpillFile(tmp_path / "spill.jsonl"),
        can_publish=lambda: True,
    )
    return JournalShipper(journal_dir, pipeline, batch=3, alive=alive)


def _dead_writer() -> str:
    return f"{dead_pid()}.1"


def test_a_gateway_restarted_under_its_old_pid_loses_no_segment(tmp_path: Path) -> None:
    # A container restarts the gateway as pid 1 again. The first run left segments 0-2, the
    # last half shipped; the second starts again at segment 0 and is still writing it.
    journal_dir = tmp_path / "journal"
    first, second = Incarnation(1, "1000"), Incarnation(1, "2000")
    before = Journal(journal_dir, segment_records=2, writer=first)
    for n in range(6):
        before.append(_call(n))
    shipped = Shipped()
    assert asyncio.run(_shipper(journal_dir, tmp_path, shipped, lambda w: w == first).ship_once())
    after = Journal(journal_dir, segment_records=2, writer=second)
    after.append(_call(6))
    shipper = _shipper(journal_dir, tmp_path, shipped, lambda w: w == second)
    asyncio.run(shipper.ship_once())
    assert sorted(shipped.refs) == [f"req-{n}" for n in range(7)]
    # The first run's segments are shipped whole and gone; the live one is kept, to be tailed.
    assert [s.path for s in shipper.segments()] == [after.path(0)]
    after.append(_call(7))
    asyncio.run(shipper.ship_once())
    assert shipped.refs[-1] == "req-7"
    assert len(shipped.refs) == 8


def test_a_segment_of_an_earlier_version_is_shipped_and_deleted(tmp_path: Path) -> None:
    # Named by pid alone, as before writers were incarnations: whatever runs under that pid
    # now (here this very process) is not its writer.
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    legacy = journal_dir / f"{os.getpid()}-3.jsonl"
    legacy.write_bytes(json.dumps(_call(0).to_record()).encode() + b"\n")
    shipped = Shipped()
    assert asyncio.run(_shipper(journal_dir, tmp_path, shipped).ship_once()) == 1
    assert shipped.refs == ["req-0"]
    assert not legacy.exists()


def test_offset_records_and_the_lock_are_0600(tmp_path: Path) -> None:
    journal_dir = tmp_path / "journal"
    writer = Journal(journal_dir)
    writer.append(_call(0))
    shipper = _shipper(journal_dir, tmp_path, Shipped())
    asyncio.run(shipper.ship_once())
    [segment] = shipper.segments()
    assert stat.S_IMODE(segment.offset_path.stat().st_mode) == 0o600
    assert asyncio.run(shipper.acquire(asyncio.Event()))
    shipper.release()
    assert stat.S_IMODE((journal_dir / ".shipper.lock").stat().st_mode) == 0o600


def test_a_live_segment_is_tailed_and_kept_a_closed_one_is_shipped_and_deleted(
    tmp_path: Path,
) -> None:
    journal_dir = tmp_path / "journal"
    writer = Journal(journal_dir, segment_records=4)
    shipped = Shipped()
    shipper = _shipper(journal_dir, tmp_path, shipped)
    for n in range(2):
        writer.append(_call(n))
    assert asyncio.run(shipper.ship_once()) == 2
    [live] = shipper.segments()
    assert live.path.exists()  # its writer may still append to it
    assert live.offset_path.read_text() == str(live.path.stat().st_size)

    for n in range(2, 7):  # fills the first segment (4) and opens a second one
        writer.append(_call(n))
    assert asyncio.run(shipper.ship_once()) == 5
    assert shipped.refs == [f"req-{n}" for n in range(7)]
    [current] = shipper.segments()
    assert current.name.number == live.name.number + 1
    assert not live.path.exists()
    assert not live.offset_path.exists()
    # Nothing new: nothing shipped twice.
    assert asyncio.run(shipper.ship_once()) == 0
    assert len(shipped.refs) == 7


def test_a_line_still_being_written_waits_for_its_newline(tmp_path: Path) -> None:
    journal_dir = tmp_path / "journal"
    writer = Journal(journal_dir)
    writer.append(_call(0))
    [segment] = journal_dir.glob("*.jsonl")
    whole = segment.read_bytes()
    with segment.open("ab") as handle:  # half of a second record, as a writer mid-write leaves it
        handle.write(whole[: len(whole) // 2])
    batch = read_batch(segment, 0, limit=10)
    assert [c.request_id for c in batch.calls] == ["req-0"]
    assert batch.end == len(whole)
    with segment.open("ab") as handle:
        handle.write(whole[len(whole) // 2 :])
    assert len(read_batch(segment, batch.end, limit=10).calls) == 1


def test_a_restarted_shipper_goes_on_from_its_recorded_offset(tmp_path: Path) -> None:
    journal_dir = tmp_path / "journal"
    writer = Journal(journal_dir)
    for n in range(3):
        writer.append(_call(n))
    first = Shipped()
    asyncio.run(_shipper(journal_dir, tmp_path, first).ship_once())
    for n in range(3, 5):
        writer.append(_call(n))
    second = Shipped()
    assert asyncio.run(_shipper(journal_dir, tmp_path, second).ship_once()) == 2
    assert first.refs + second.refs == [f"req-{n}" for n in range(5)]


def test_a_dead_writers_segment_with_a_torn_tail_is_shipped_and_deleted(tmp_path: Path) -> None:
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    records = [json.dumps(_call(n).to_record()).encode() + b"\n" for n in range(2)]
    orphan = journal_dir / f"{_dead_writer()}-0.jsonl"
    orphan.write_bytes(records[0] + records[1] + b'{"api": "open')  # killed mid-write
    (journal_dir / (orphan.name + OFFSET_SUFFIX)).write_text("garbage")  # torn offset record
    shipped = Shipped()
    assert asyncio.run(_shipper(journal_dir, tmp_path, shipped).ship_once()) == 2
    assert shipped.refs == ["req-0", "req-1"]
    assert sorted(p.name for p in journal_dir.iterdir()) == []


def test_an_unreadable_line_is_skipped_and_the_rest_shipped(tmp_path: Path) -> None:
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    good = json.dumps(_call(1).to_record()).encode() + b"\n"
    (journal_dir / f"{_dead_writer()}-0.jsonl").write_bytes(b"\x00\x01 not json\n" + good)
    shipped = Shipped()
    assert asyncio.run(_shipper(journal_dir, tmp_path, shipped).ship_once()) == 1
    assert shipped.refs == ["req-1"]


def test_a_second_shipper_waits_while_the_first_holds_the_directory(tmp_path: Path) -> None:
    journal_dir = tmp_path / "journal"

    async def scenario() -> tuple[bool, bool]:
        first = _shipper(journal_dir, tmp_path, Shipped())
        second = _shipper(journal_dir, tmp_path, Shipped())
        never = asyncio.Event()
        assert await first.acquire(never)
        stop = asyncio.Event()
        waiting = asyncio.create_task(second.acquire(stop, retry_s=0.01))
        await asyncio.sleep(0.1)
        blocked = not waiting.done()
        first.release()
        taken = await asyncio.wait_for(waiting, 5)
        second.release()
        return blocked, taken

    assert asyncio.run(scenario()) == (True, True)


@pytest.mark.parametrize("pid_alive", [True, False])
def test_a_writers_only_segment_is_deleted_only_once_it_is_gone(
    tmp_path: Path, pid_alive: bool
) -> None:
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    writer = this_incarnation().name if pid_alive else _dead_writer()
    segment = journal_dir / f"{writer}-0.jsonl"
    segment.write_bytes(json.dumps(_call(0).to_record()).encode() + b"\n")
    asyncio.run(_shipper(journal_dir, tmp_path, Shipped()).ship_once())
    assert segment.exists() is pid_alive


def test_a_writer_that_closed_its_journal_has_its_last_segment_shipped_and_deleted(
    tmp_path: Path,
) -> None:
    # A clean stop: the service closes the journal, then stops its shipper while it still runs.
    journal_dir = tmp_path / "journal"
    writer = Journal(journal_dir)
    writer.append(_call(0))
    shipped = Shipped()
    shipper = _shipper(journal_dir, tmp_path, shipped)
    asyncio.run(shipper.ship_once())
    assert shipper.segments()  # live: kept
    writer.close()
    asyncio.run(shipper.ship_once())
    assert shipped.refs == ["req-0"]
    assert sorted(p.name for p in journal_dir.iterdir()) == []
