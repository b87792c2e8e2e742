"""Leases on uploaded files: exactly one live process works a file, a dead process's files are
taken over once their lease runs out, and a process that lost a lease writes nothing.

Each "process" here is a lease owner in the test's event loop, on a real database (SQLite and
PostgreSQL) and real S3; the pipeline stores what it publishes the way the persister does.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session

from services.ingest.capture.pipeline import CapturePipeline
from services.ingest.capture.spill import SpillFile
from services.ingest.models import SampleRow, UploadedFile
from services.ingest.samples.store import insert_samples
from services.ingest.uploads import files as uploads
from services.ingest.uploads import leases
from shared.db import utcnow
from shared.events import SampleCaptured
from shared.storage import ObjectStore
from tests.plugins.infra import dead_pid

LINE = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
LINES = 3
ATTEMPTS = 3


class StoringPipeline:
    """A capture pipeline whose publish stores each sample (as the persister would) and notes
    its id; `gate`, while clear, holds every publish (a file that takes long to import)."""

    def __init__(
        self, engine: Engine, tmp_path: Path, *, gate: asyncio.Event | None = None
    ) -> None:
        self.engine = engine
        self.gate = gate
        self.published: list[str] = []
        self.pipeline = CapturePipeline(
            publish=self._publish,
            store=None,
            spill=SpillFile(tmp_path / f"spill-{id(self)}.jsonl"),
            can_publish=lambda: True,
        )

    async def _publish(self, event: SampleCaptured) -> None:
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.to_thread(self._store, event)
        self.published.append(event.sample.id)

    def _store(self, event: SampleCaptured) -> None:
        with Session(self.engine) as session:
            insert_samples(session, [event.sample])


def _ago(seconds: float) -> leases.Clock:
    """A clock stopped `seconds` in the past: a lease taken by it has run for that long."""
    then = utcnow() - timedelta(seconds=seconds)
    return lambda: then


def _uploaded(engine: Engine, store: ObjectStore, tmp_path: Path) -> UploadedFile:
    """A file stored in S3 with its row `uploaded`, as POST /v1/files leaves it."""
    file_id = uploads.new_file_id()
    body = b"".join(json.dumps(LINE).encode() + b"\n" for _ in range(LINES))
    size = uploads.store_upload(
        store, io.BytesIO(body), tenant="acme", file_id=file_id, spool_dir=tmp_path / "spool"
    )
    row = UploadedFile(
        id=file_id, tenant="acme", filename="a.jsonl", purpose="fine-tune", bytes=size
    )
    with Session(engine, expire_on_commit=False) as session:
        session.add(row)
        session.commit()
    return row


def _row(engine: Engine, file_id: str) -> UploadedFile:
    with Session(engine) as session:
        row = session.get(UploadedFile, file_id)
        assert row is not None
        return row


def _stored_samples(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.execute(sa.select(sa.func.count()).select_from(SampleRow)).scalar_one())


class Process:
    """One ingest process's part in this: it starts a claim-and-work task per file it is handed
    (by its sweep), as Ingest.process_in_background does."""

    def __init__(
        self, engine: Engine, store: ObjectStore, tmp_path: Path, lease_s: float, name: str
    ) -> None:
        self.engine, self.store, self.lease_s = engine, store, lease_s
        self.spool_dir = tmp_path / name / "uploads"
        self.tasks: list[asyncio.Task[None]] = []
        self.sweeper: asyncio.Task[None] | None = None

    def start(self, pipeline: StoringPipeline) -> Callable[[UploadedFile], None]:
        def work(row: UploadedFile) -> None:
            self.tasks.append(
                asyncio.create_task(
                    uploads.claim_and_process(
                        engine=self.engine,
                        store=self.store,
                        pipeline=pipeline.pipeline,
                        row=row,
                        spool_dir=self.spool_dir,
                        lease_s=self.lease_s,
                        max_attempts=ATTEMPTS,
                    )
                )
            )

        return work

    def sweep(self, pipeline: StoringPipeline) -> None:
        self.sweeper = asyncio.create_task(
            uploads.sweep(self.engine, every_s=self.lease_s / 2, start=self.start(pipeline))
        )

    async def stop(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, *filter(None, [self.sweeper]), return_exceptions=True)


async def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await asyncio.to_thread(condition):
            return True
        await asyncio.sleep(0.05)
    return False


def test_claimers_racing_for_a_file_exactly_one_wins(
    db_engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    row = _uploaded(db_engine, object_store, tmp_path)
    owners = [leases.new_lease_owner() for _ in range(8)]
    start = threading.Barrier(len(owners))
    won: list[str] = []

    def race(owner: str) -> None:
        start.wait()
        if (
            leases.claim(db_engine, row.id, owner=owner, lease_s=30, max_attempts=ATTEMPTS)
            is not None
        ):
            won.append(owner)

    threads = [threading.Thread(target=race, args=(owner,)) for owner in owners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    held = _row(db_engine, row.id)
    assert (held.lease_owner, held.status) == (won[0], "processing")
    # A finished file is nobody's to claim, lease or not.
    assert leases.finish(db_engine, row.id, owner=won[0], status="processed")
    assert (
        leases.claim(db_engine, row.id, owner=owners[0], lease_s=30, max_attempts=ATTEMPTS) is None
    )


async def test_a_dead_owners_file_is_taken_over_by_a_sweep_and_stored_once(
    db_engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    row = _uploaded(db_engine, object_store, tmp_path)
    # Its process claimed it, then died: nobody renews the lease.
    dead = leases.new_lease_owner()
    assert (
        leases.claim(db_engine, row.id, owner=dead, lease_s=2.0, max_attempts=ATTEMPTS) is not None
    )
    stored = StoringPipeline(db_engine, tmp_path)
    live = Process(db_engine, object_store, tmp_path, lease_s=0.6, name="live")
    live.sweep(stored)
    try:
        await asyncio.sleep(0.5)  # sweeps ran meanwhile; the lease still runs
        assert _row(db_engine, row.id).lease_owner == dead
        assert stored.published == []
        assert await _wait_for(lambda: _row(db_engine, row.id).status == "processed", 20)
    finally:
        await live.stop()
    done = _row(db_engine, row.id)
    assert json.loads(done.report or b"{}")["accepted_lines"] == LINES
    assert (done.lease_owner, done.lease_expires_at) == (None, None)
    assert len(stored.published) == len(set(stored.published)) == LINES
    assert _stored_samples(db_engine) == LINES


async def test_a_live_owners_renewed_lease_is_not_taken(
    db_engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    row = _uploaded(db_engine, object_store, tmp_path)
    gate = asyncio.Event()  # the owner's import takes as long as the test says
    slow = StoringPipeline(db_engine, tmp_path, gate=gate)
    other = StoringPipeline(db_engine, tmp_path)
    lease_s = 1.0  # renewed every third: a slow runner still renews in time
    owner = Process(db_engine, object_store, tmp_path, lease_s, name="owner")
    rival = Process(db_engine, object_store, tmp_path, lease_s, name="rival")
    owner.start(slow)(row)  # the process that received the upload
    try:
        assert await _wait_for(lambda: _row(db_engine, row.id).lease_owner is not None, 10)
        holder = _row(db_engine, row.id).lease_owner
        rival.sweep(other)
        await asyncio.sleep(lease_s * 3)  # several renewals and rival sweeps
        assert _row(db_engine, row.id).lease_owner == holder
        assert other.published == []
        gate.set()
        assert await _wait_for(lambda: _row(db_engine, row.id).status == "processed", 20)
        await asyncio.sleep(lease_s)  # a sweep after the end takes nothing either
    finally:
        await owner.stop()
        await rival.stop()
    assert other.published == []
    assert len(slow.published) == LINES
    assert _stored_samples(db_engine) == LINES


async def test_the_loser_of_a_lease_stops_and_does_not_overwrite_the_status(
    db_engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    row = _uploaded(db_engine, object_store, tmp_path)
    paused = leases.new_lease_owner()
    # Claimed a minute ago with a 30 s lease, and paused since, without a renewal.
    claimed = leases.claim(
        db_engine, row.id, owner=paused, lease_s=30, max_attempts=ATTEMPTS, clock=_ago(60)
    )
    assert claimed is not None
    taker = leases.new_lease_owner()
    assert (
        leases.claim(db_engine, row.id, owner=taker, lease_s=30, max_attempts=ATTEMPTS) is not None
    )

    # The paused process carries on: its next renewal fails, so it stops before the end.
    spool_dir = tmp_path / "paused" / "uploads"
    held = StoringPipeline(db_engine, tmp_path, gate=asyncio.Event())
    await asyncio.wait_for(
        uploads.process_file(
            engine=db_engine,
            store=object_store,
            pipeline=held.pipeline,
            row=claimed,
            spool_dir=spool_dir,
            owner=paused,
            lease_s=0.3,
        ),
        timeout=10,
    )
    assert _row(db_engine, row.id).lease_owner == taker
    assert list(spool_dir.glob("*")) == []
    assert not leases.finish(db_engine, row.id, owner=paused, status="error", status_details="x")
    assert not leases.renew(db_engine, row.id, owner=paused, lease_s=30)
    assert leases.finish(db_engine, row.id, owner=taker, status="processed")
    assert not leases.finish(db_engine, row.id, owner=paused, status="error")
    done = _row(db_engine, row.id)
    assert (done.status, done.status_details) == ("processed", None)


async def test_a_stopping_process_hands_its_file_back(
    db_engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    row = _uploaded(db_engine, object_store, tmp_path)
    held = StoringPipeline(db_engine, tmp_path, gate=asyncio.Event())
    stopping = Process(db_engine, object_store, tmp_path, lease_s=30, name="stopping")
    stopping.start(held)(row)
    assert await _wait_for(lambda: _row(db_engine, row.id).lease_owner is not None, 10)
    await stopping.stop()
    # Claimable at once, not after 30 s.
    handed_back = _row(db_engine, row.id)
    assert (handed_back.status, handed_back.lease_owner) == ("processing", None)
    assert handed_back.attempts == 0  # handed back, not died: no attempt spent
    assert [r.id for r in leases.claimable(db_engine)] == [row.id]


def test_the_files_api_shows_no_lease(
    db_engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    row = _uploaded(db_engine, object_store, tmp_path)
    owner = leases.new_lease_owner()
    claimed = leases.claim(db_engine, row.id, owner=owner, lease_s=30, max_attempts=ATTEMPTS)
    assert claimed is not None
    assert set(uploads.file_object(claimed)) == {
        "id", "object", "bytes", "created_at", "filename", "purpose", "status", "status_details",
    }  # fmt: skip


async def test_a_file_whose_workers_keep_dying_is_given_up_with_a_reason(
    db_engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> None:
    row = _uploaded(db_engine, object_store, tmp_path)
    # Three processes in turn took it and died (a file that takes its worker down): a claim a
    # minute, each lease running out 30 s after its claim.
    for minutes_ago in range(ATTEMPTS, 0, -1):
        dying = leases.new_lease_owner()
        clock = _ago(60 * minutes_ago)
        claimed = leases.claim(
            db_engine, row.id, owner=dying, lease_s=30, max_attempts=ATTEMPTS, clock=clock
        )
        assert claimed is not None
    assert _row(db_engine, row.id).attempts == ATTEMPTS
    stored = StoringPipeline(db_engine, tmp_path)
    live = Process(db_engine, object_store, tmp_path, lease_s=0.6, name="live")
    live.sweep(stored)
    try:
        assert await _wait_for(lambda: _row(db_engine, row.id).status == "error", 10)
    finally:
        await live.stop()
    given_up = _row(db_engine, row.id)
    assert given_up.status_details is not None
    assert f"given up after {ATTEMPTS} attempts" in given_up.status_details
    assert (given_up.lease_owner, given_up.lease_expires_at) == (None, None)
    assert stored.published == []
    assert leases.claimable(db_engine) == []
    assert uploads.file_object(given_up)["status"] == "error"


def test_spool_files_of_killed_processes_are_cleared(tmp_path: Path) -> None:
    spool = tmp_path / "uploads"
    spool.mkdir()
    dead, alive = dead_pid(), os.getpid()
    names = {
        f"{dead}.k3j9x1ab.upload": False,  # store_upload's copy, its process killed
        f"file-0123456789abcdef01234567.{dead}.1a2b3c4d.jsonl": False,  # an import's copy
        f"{alive}.q8w7e6r5.upload": True,  # this process's, in use
        f"file-0123456789abcdef01234567.{alive}.5e6f7a8b.jsonl": True,
        "notes.txt": True,  # not ours to judge
    }
    for name in names:
        (spool / name).write_bytes(b"x")
    assert uploads.clear_dead_spool(spool) == 2
    assert {p.name for p in spool.iterdir()} == {n for n, kept in names.items() if kept}
    assert uploads.clear_dead_spool(tmp_path / "missing") == 0


def test_store_upload_names_its_spool_copy_after_its_process(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    seen: list[str] = []

    class Watching(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            seen.extend(p.name for p in spool.iterdir())
            return super().read(size)

    uploads.store_upload(
        object_store, Watching(b"{}\n"), tenant="acme", file_id="file-x", spool_dir=spool
    )
    assert seen
    assert all(name.startswith(f"{os.getpid()}.") for name in seen)
    assert list(spool.iterdir()) == []  # removed once stored
