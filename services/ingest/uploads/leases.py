"""Leases on uploaded files: which process works a file. A lease runs out unless its holder
renews it, so a killed process's files are taken over by the sweep of a live one; every write
of a file's outcome checks the writer still holds the lease.

Time comes from `clock` (the database's UTC now by default): tests move it instead of waiting
for short leases to run out.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from services.ingest.models import UploadedFile
from shared.db import session_scope, utcnow

log = logging.getLogger("tuneloop.ingest.uploads")

Clock = Callable[[], datetime]

_UNFINISHED = ("uploaded", "processing")


def new_lease_owner() -> str:
    """host:pid say which process holds a lease; the random part tells its claims apart, so a
    process that lost a lease while paused and took the file again later is not its own rival."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _claimable(now: datetime) -> sa.ColumnElement[bool]:
    expires = col(UploadedFile.lease_expires_at)
    return sa.and_(
        col(UploadedFile.status).in_(_UNFINISHED),
        sa.or_(expires.is_(None), expires < now),
    )


def first_lease(owner: str, *, lease_s: float, clock: Clock = utcnow) -> dict[str, Any]:
    """The lease fields of a new upload's row, written with it: the process that received the
    file works it, and no sweep elsewhere can take it in between. The status stays `uploaded`,
    as OpenAI's files API answers; `processing` marks a file taken over by a sweep."""
    return {
        "lease_owner": owner,
        "lease_expires_at": clock() + timedelta(seconds=lease_s),
        "attempts": 1,
    }


def claim(
    engine: Engine,
    file_id: str,
    *,
    owner: str,
    lease_s: float,
    max_attempts: int,
    clock: Clock = utcnow,
) -> UploadedFile | None:
    """Take the file for `owner` when it is unfinished and no lease on it runs. Returns the row
    as claimed, or None: another process holds it, or it is done, or it was given up now
    because `max_attempts` claims before this one never finished it."""
    now = clock()
    attempts = col(UploadedFile.attempts)
    mine = _claimable(now), col(UploadedFile.id) == file_id
    take = (
        sa.update(UploadedFile)
        .where(*mine, attempts < max_attempts)
        .values(
            status="processing",
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_s),
            attempts=attempts + 1,
        )
    )
    give_up = (
        sa.update(UploadedFile)
        .where(*mine, attempts >= max_attempts)
        .values(
            status="error",
            status_details=f"given up after {max_attempts} attempts: each process working "
            "the file stopped before finishing it (killed, or out of memory?)",
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    with session_scope(engine) as session:
        if session.execute(take).rowcount != 1:  # type: ignore[attr-defined]
            if session.execute(give_up).rowcount == 1:  # type: ignore[attr-defined]
                session.commit()
                log.error("file %s given up after %d attempts", file_id, max_attempts)
            return None
        session.commit()
        return session.get(UploadedFile, file_id)


def _update_mine(engine: Engine, file_id: str, owner: str, **values: Any) -> bool:
    """Update the row only while `owner` holds the file's lease; False once it does not."""
    statement = (
        sa.update(UploadedFile)
        .where(
            col(UploadedFile.id) == file_id,
            col(UploadedFile.lease_owner) == owner,
            col(UploadedFile.status).in_(_UNFINISHED),
        )
        .values(**values)
    )
    with session_scope(engine) as session:
        mine = session.execute(statement).rowcount == 1  # type: ignore[attr-defined]
    return bool(mine)


def renew(
    engine: Engine, file_id: str, *, owner: str, lease_s: float, clock: Clock = utcnow
) -> bool:
    # Still ours after running out, as long as nobody took it meanwhile.
    return _update_mine(
        engine, file_id, owner, lease_expires_at=clock() + timedelta(seconds=lease_s)
    )


def release(engine: Engine, file_id: str, *, owner: str) -> bool:
    """Hand an unfinished file back (shutting down): the next sweep anywhere may take it. A
    file handed back was not the death of its process: the attempt does not count."""
    return _update_mine(
        engine,
        file_id,
        owner,
        lease_owner=None,
        lease_expires_at=None,
        attempts=col(UploadedFile.attempts) - 1,
    )


def finish(engine: Engine, file_id: str, *, owner: str, **outcome: Any) -> bool:
    """Write the outcome (status, details, report) if `owner` still holds the lease."""
    return _update_mine(engine, file_id, owner, lease_owner=None, lease_expires_at=None, **outcome)


def claimable(engine: Engine, *, clock: Clock = utcnow) -> list[UploadedFile]:
    """Unfinished files no live process holds: new ones, and those whose process died."""
    with session_scope(engine) as session:
        return list(session.exec(select(UploadedFile).where(_claimable(clock()))))
