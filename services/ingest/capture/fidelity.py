"""The fidelity report, durable: totals per tenant, source, kind and reason in `ingest_fidelity`.

Each ingest process counts in memory (`Fidelity`) and adds what it counted to the table
every few seconds (`FidelityFlusher`), so the report covers every worker process and survives
restarts. A failed flush puts its counts back for the next one. Reasons can quote input (an
unknown key's name), so past `MAX_STORED_REASONS` distinct reasons of one tenant, source and kind,
new ones share the bucket "(other reasons)".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.ingest.models import FidelityCount
from services.ingest.samples.store import dialect_insert
from shared.db import session_scope

_MAX_REASONS = 10_000


class FidelityDelta(NamedTuple):
    tenant: str
    source: str
    kind: str  # samples | rejected | dropped
    reason: str  # "" for samples
    added: int  # (not `count`: a tuple's own method)


@dataclass
class Fidelity:
    """What each source made of its input: samples, and what was rejected or dropped, by reason.

    Counted in this process since the last `drain`; fidelity.py adds the drained counts to the
    database's totals every few seconds, and `report` gives one tenant's unflushed view.
    """

    samples: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejected: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    dropped: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def count_sample(self, tenant: str, source: str) -> None:
        self.samples[(tenant, source)] += 1

    def count_rejected(self, tenant: str, source: str, reason: str) -> None:
        self._count(self.rejected, tenant, source, reason)

    def count_dropped(self, tenant: str, source: str, reason: str) -> None:
        self._count(self.dropped, tenant, source, reason)

    @staticmethod
    def _count(
        counter: Counter[tuple[str, str, str]], tenant: str, source: str, reason: str
    ) -> None:
        # Reasons can quote input (an unknown key's name); past a bound, they share one bucket.
        key = (tenant, source, reason[:200])
        if key not in counter and len(counter) >= _MAX_REASONS:
            key = (tenant, source, "(other reasons)")
        counter[key] += 1

    def drain(self) -> list[FidelityDelta]:
        """Every count as (tenant, source, kind, reason, n), and start again from zero."""
        deltas = [FidelityDelta(t, s, "samples", "", n) for (t, s), n in self.samples.items()]
        for kind, counter in (("rejected", self.rejected), ("dropped", self.dropped)):
            deltas += [FidelityDelta(t, s, kind, r, n) for (t, s, r), n in counter.items()]
        self.samples, self.rejected, self.dropped = Counter(), Counter(), Counter()
        return deltas

    def restore(self, deltas: list[FidelityDelta]) -> None:
        """Put drained counts back (their flush failed), so none is lost."""
        for d in deltas:
            if d.kind == "samples":
                self.samples[(d.tenant, d.source)] += d.added
            else:
                counter = self.rejected if d.kind == "rejected" else self.dropped
                counter[(d.tenant, d.source, d.reason)] += d.added

    def report(self, tenant: str) -> dict[str, Any]:
        sources = {source for (t, source) in self.samples if t == tenant}
        sources |= {source for (t, source, _) in (*self.rejected, *self.dropped) if t == tenant}
        return {
            source: {
                "samples": self.samples[(tenant, source)],
                "rejected": {
                    r: n for (t, s, r), n in self.rejected.items() if (t, s) == (tenant, source)
                },
                "dropped": {
                    r: n for (t, s, r), n in self.dropped.items() if (t, s) == (tenant, source)
                },
            }
            for source in sorted(sources)
        }


MAX_STORED_REASONS = 1_000
OTHER_REASONS = "(other reasons)"
log = logging.getLogger("tuneloop.ingest.fidelity")


def _known_reasons(
    session: Session, deltas: list[FidelityDelta]
) -> dict[tuple[str, ...], set[str]]:
    keys = {(d.tenant, d.source, d.kind) for d in deltas if d.kind != "samples"}
    known: dict[tuple[str, ...], set[str]] = defaultdict(set)
    if not keys:
        return known
    rows = session.exec(
        select(FidelityCount.tenant, FidelityCount.source, FidelityCount.kind, FidelityCount.reason)
        .where(col(FidelityCount.tenant).in_({k[0] for k in keys}))
        .where(col(FidelityCount.kind) != "samples")
    )
    for tenant, source, kind, reason in rows:
        known[(tenant, source, kind)].add(reason)
    return known


def _bounded(
    session: Session, deltas: list[FidelityDelta], max_reasons: int
) -> dict[tuple[str, ...], int]:
    """Deltas summed by row key, new reasons past the bound folded into OTHER_REASONS."""
    known = _known_reasons(session, deltas)
    totals: dict[tuple[str, ...], int] = defaultdict(int)
    for d in deltas:
        reason = d.reason
        seen = known[(d.tenant, d.source, d.kind)]
        if d.kind != "samples" and reason not in seen:
            if len(seen) >= max_reasons:
                reason = OTHER_REASONS
            seen.add(reason)
        totals[(d.tenant, d.source, d.kind, reason)] += d.added
    return totals


def store_deltas(
    engine: Engine, deltas: list[FidelityDelta], *, max_reasons: int = MAX_STORED_REASONS
) -> None:
    """Add the deltas to the stored totals, in one transaction."""
    if not deltas:
        return
    with session_scope(engine) as session:
        rows = [
            {"tenant": t, "source": s, "kind": k, "reason": r, "count": n}
            for (t, s, k, r), n in _bounded(session, deltas, max_reasons).items()
        ]
        table = cast(sa.Table, FidelityCount.__table__)  # type: ignore[attr-defined]
        insert = dialect_insert(session, table)
        session.execute(
            insert.on_conflict_do_update(
                index_elements=["tenant", "source", "kind", "reason"],
                set_={"count": table.c.count + insert.excluded.count},
            ),
            rows,
        )


def stored_report(engine: Engine, tenant: str) -> dict[str, Any]:
    """One tenant's stored totals, shaped as capture.Fidelity.report."""
    with session_scope(engine) as session:
        rows = session.exec(select(FidelityCount).where(FidelityCount.tenant == tenant)).all()
    report: dict[str, Any] = {}
    for row in rows:
        entry = report.setdefault(row.source, {"samples": 0, "rejected": {}, "dropped": {}})
        if row.kind == "samples":
            entry["samples"] += row.count
        else:
            entry[row.kind][row.reason] = entry[row.kind].get(row.reason, 0) + row.count
    return report


def merge_reports(stored: dict[str, Any], pending: dict[str, Any]) -> dict[str, Any]:
    merged = {source: _copy(entry) for source, entry in stored.items()}
    for source, entry in pending.items():
        into = merged.setdefault(source, {"samples": 0, "rejected": {}, "dropped": {}})
        into["samples"] += entry["samples"]
        for kind in ("rejected", "dropped"):
            for reason, n in entry[kind].items():
                into[kind][reason] = into[kind].get(reason, 0) + n
    return dict(sorted(merged.items()))


def _copy(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "samples": entry["samples"],
        "rejected": dict(entry["rejected"]),
        "dropped": dict(entry["dropped"]),
    }


class FidelityFlusher:
    """Adds this process's counts to the table every `interval_s`, and once more at stop."""

    def __init__(self, fidelity: Fidelity, engine: Engine, *, interval_s: float = 2.0) -> None:
        self.fidelity = fidelity
        self._engine = engine
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def flush(self) -> None:
        # Drained on the event loop (where the counting happens), written in a thread.
        deltas = self.fidelity.drain()
        try:
            await asyncio.to_thread(store_deltas, self._engine, deltas)
        except (sa.exc.SQLAlchemyError, OSError) as exc:
            self.fidelity.restore(deltas)
            log.warning("fidelity counts kept for the next flush: %s", type(exc).__name__)

    async def report(self, tenant: str) -> dict[str, Any]:
        pending = self.fidelity.report(tenant)
        stored = await asyncio.to_thread(stored_report, self._engine, tenant)
        return merge_reports(stored, pending)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.flush()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fidelity-flusher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
