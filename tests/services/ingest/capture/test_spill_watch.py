"""Spill episodes as plain calls on a real spill file: the ledger counts whose samples went in
(kept or refused, never a replay's write-back), the backlog counts what waits (each file's
lines once as it grows), and the watcher tells each tenant of an episode once the file has
stayed empty and the bus is back, again after a failed publish under the same event id. A real
ingest process with a nats-server stopped and started again: test_capture_spill.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.ingest.capture.spill import SpillFile
from services.ingest.capture.spill_contents import BacklogCounter, SpillLedger
from services.ingest.capture.spill_watch import SpillWatch
from shared.events import CaptureSpilled, Event

T0 = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
SAMPLE = {"id": "s", "text": "x" * 80}  # ~110 bytes a line


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: float) -> None:
        self.now = T0 + timedelta(seconds=seconds)


class Bus(list[Event]):
    up = True
    fail_next = False

    async def publish(self, event: Event) -> None:
        if self.fail_next:
            self.fail_next = False
            raise TimeoutError("no ack from the stream")
        self.append(event)


def _spill(tmp_path: Path, clock: Clock, max_bytes: int = 10_000) -> SpillFile:
    path = tmp_path / "capture-spill.jsonl"
    return SpillFile(path, max_bytes=max_bytes, ledger=SpillLedger(path.with_name("l.jsonl"),
                                                                   clock=clock))  # fmt: skip


def _replayed(spill: SpillFile) -> None:
    """What a replay that delivered everything leaves: no file."""
    for claimed in spill.claim():
        claimed.unlink()


def test_the_ledger_counts_each_tenants_samples_once_and_a_torn_line_is_skipped(
    tmp_path: Path,
) -> None:
    clock = Clock()
    spill = _spill(tmp_path, clock, max_bytes=400)
    assert spill.ledger is not None
    kept = [spill.append("sample", SAMPLE, tenant="acme") for _ in range(4)]
    assert kept == [True, True, True, False]  # the fourth is past the cap
    clock.at(5)
    assert spill.append("sample", SAMPLE, tenant="globex") is False
    with SpillFile.readmitting():  # a replay writing back what failed again: counted already
        assert spill.append("sample", SAMPLE, tenant="acme")
    spill.append("sample", SAMPLE)  # no tenant (an earlier caller): kept, not counted
    spill.ledger.flush()
    spill.ledger.flush()  # nothing new: no line
    with spill.ledger.path.open("ab") as handle:
        handle.write(b'{"tenant": "acme", "samp')  # a writer killed mid-line

    totals = spill.ledger.claim()
    line = len(spill.path.read_bytes().splitlines()[0]) + 1
    assert {t: (x.samples, x.bytes, x.refused) for t, x in totals.items()} == {
        "acme": (3, 3 * line, 1),
        "globex": (0, 0, 1),
    }
    assert (totals["acme"].first, totals["globex"].last) == (T0, T0 + timedelta(seconds=5))
    # Flushed after the claim: the next episode's.
    spill.ledger.count("acme", 10, kept=True)
    spill.ledger.flush()
    assert set(spill.ledger.claim()) == {"acme", "globex"}  # the unreleased claim, as it was
    spill.ledger.release()
    assert {t: x.samples for t, x in spill.ledger.claim().items()} == {"acme": 1}


def test_the_backlog_counts_each_files_lines_once_as_it_grows(tmp_path: Path) -> None:
    spill = _spill(tmp_path, Clock())
    counter = BacklogCounter(spill.files)
    assert counter.count() == (0, 0)
    for _ in range(3):
        spill.append("sample", SAMPLE, tenant="acme")
    size = spill.path.stat().st_size
    assert counter.count() == (3, size)
    [claimed] = spill.claim()  # renamed aside: the same file, not read again
    spill.append("sample", SAMPLE, tenant="acme")
    assert counter.count() == (4, size + spill.path.stat().st_size)
    claimed.unlink()
    assert counter.count() == (1, spill.path.stat().st_size)


async def test_an_episode_is_told_to_each_tenant_once_the_file_is_empty_and_the_bus_back(
    tmp_path: Path,
) -> None:
    clock, bus = Clock(), Bus()
    spill = _spill(tmp_path, clock, max_bytes=1000)
    assert spill.ledger is not None
    watch = SpillWatch(spill, publish=bus.publish, can_publish=lambda: bus.up, clock=clock)
    bus.up = False
    for tenant in ("acme", "acme", "globex"):
        spill.append("sample", SAMPLE, tenant=tenant)
    spill.ledger.flush()
    clock.at(1)
    await watch.tick()
    assert watch.episode is not None
    assert watch.episode.max_bytes == spill.path.stat().st_size

    _replayed(spill)  # replayed by the shipper (S3 was away, the bus not)
    clock.at(10)
    await watch.tick()
    clock.at(12)
    await watch.tick()
    assert bus == []  # empty for 2 s only: a writer may still have counts to flush
    clock.at(14)
    await watch.tick()
    assert bus == []  # the bus is away
    bus.up, bus.fail_next = True, True
    clock.at(15)
    with pytest.raises(TimeoutError):
        await watch.tick()
    clock.at(16)
    await watch.tick()

    assert [type(e) for e in bus] == [CaptureSpilled, CaptureSpilled]
    acme, globex = (e for e in bus if isinstance(e, CaptureSpilled))
    assert (acme.tenant, acme.samples, acme.refused, globex.tenant, globex.samples) == (
        "acme",
        2,
        0,
        "globex",
        1,
    )
    assert (acme.started_at, acme.ended_at) == (T0, T0 + timedelta(seconds=10))
    assert acme.max_backlog_fraction == pytest.approx(3 * acme.bytes / 2 / 1000)
    assert acme.event_id != globex.event_id
    assert acme.subject == "tuneloop.acme.capture.spilled.v1"
    assert watch.episode is None
    assert not spill.ledger.has_lines()

    # Quiet again: nothing more. The next episode gets ids of its own.
    clock.at(30)
    await watch.tick()
    assert len(bus) == 2
    spill.append("sample", SAMPLE, tenant="acme")
    spill.ledger.flush()
    await watch.tick()
    _replayed(spill)
    for second in (40, 41, 44):
        clock.at(second)
        await watch.tick()
    assert len(bus) == 3
    assert bus[2].event_id not in {acme.event_id, globex.event_id}


async def test_a_failed_publish_is_published_again_under_the_same_id(tmp_path: Path) -> None:
    clock, bus = Clock(), Bus()
    spill = _spill(tmp_path, clock)
    assert spill.ledger is not None
    spill.append("sample", SAMPLE, tenant="acme")
    spill.ledger.flush()
    first = SpillWatch(spill, publish=bus.publish, can_publish=lambda: True, clock=clock)
    await first.tick()
    _replayed(spill)
    clock.at(1)
    await first.tick()
    bus.fail_next = True
    clock.at(5)
    with pytest.raises(TimeoutError):
        await first.tick()
    # The process restarts: a new watcher finds the claimed ledger and tells it.
    clock.at(60)
    again = SpillWatch(spill, publish=bus.publish, can_publish=lambda: True, clock=clock)
    for second in (60, 61, 65):
        clock.at(second)
        await again.tick()
    [told] = bus
    assert isinstance(told, CaptureSpilled)
    assert (told.samples, told.started_at) == (1, T0)  # the ledger's time, not the restart's
    spill.ledger.release()
