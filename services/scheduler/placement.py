"""Where queued jobs start now: a pure function of the queue, the live attempts, the ladder's
rungs and the rules (no database, no clock of its own), so it is tested with plain calls.

The rules, in the order they apply:
- a job with a live attempt is not placed again; a `batch` job waits outside the batch window;
  a tenant with `tenant_max_running` live attempts places nothing more;
- priority, then fairness: each free place goes to the highest priority waiting (`urgent`,
  `normal`, `batch`: urgent first, as promised), among those to the tenant with the fewest live
  attempts (those placed in this pass count), then to the oldest job (FIFO; the id breaks
  ties). A tenant that queued 100 jobs first gets one place, then the tenant that queued one
  later gets the next: nobody starves behind a long queue of the same priority;
- the job goes to the first rung by priority with room (`capacity` live attempts) where some
  device count fits its plan: the smallest of 1, 2, 4, 8 ... up to the rung's `device_count`
  (and that count itself) whose memory estimate fits one device (memory.py: a full fine-tune
  shards over the devices, LoRA's per-device need does not shrink). A job no rung with room
  fits waits; when every rung is full, the rest wait.
A job whose plan cannot be sized (a tenant's own model, an older plan) fits every rung with all
its devices, as the estimate cannot show that fewer suffice.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from services.scheduler import memory
from services.scheduler.config import SchedulerSettings
from services.scheduler.ladder import ProviderSpec
from services.scheduler.memory import Method
from services.scheduler.models import JobRow
from shared.catalogue import CATALOGUE, CatalogueEntry

PRIORITY_ORDER = {"urgent": 0, "normal": 1, "batch": 2}


@dataclass(frozen=True)
class Size:
    """What the memory estimate needs from a job's plan."""

    model: CatalogueEntry
    method: Method
    rows: int  # a micro-batch, on each device
    row_len: int
    lora_rank: int = 16


@dataclass(frozen=True)
class QueuedJob:
    id: str
    tenant: str
    priority: str
    created_at: datetime
    size: Size | None  # None: it cannot be sized

    @classmethod
    def of(cls, row: JobRow) -> QueuedJob:
        return cls(row.id, row.tenant, row.priority, row.created_at, size_of(row.model, row.plan))


@dataclass(frozen=True)
class LiveAttempt:
    job_id: str
    provider: str
    tenant: str


@dataclass(frozen=True)
class Placement:
    job_id: str
    rung: ProviderSpec
    device_count: int


def place(
    queued: Iterable[QueuedJob],
    live: Iterable[LiveAttempt],
    rungs: Sequence[ProviderSpec],
    *,
    settings: SchedulerSettings,
    now: datetime,
) -> list[Placement]:
    """The attempts to start now, in the order they were decided (the module's rules)."""
    live = list(live)
    ladder = sorted(rungs, key=lambda rung: rung.priority)  # stable: as listed within
    per_rung = Counter(attempt.provider for attempt in live)
    per_tenant = Counter(attempt.tenant for attempt in live)
    waiting = _waiting(queued, {a.job_id for a in live}, settings.in_batch_window(now.hour))
    placements: list[Placement] = []
    while waiting:
        room = [rung for rung in ladder if per_rung[rung.name] < rung.capacity]
        if not room:
            break  # every rung is full: the rest wait their turn
        for tenant in [t for t in waiting if per_tenant[t] >= settings.tenant_max_running]:
            del waiting[tenant]
        if not waiting:
            break
        tenant = min(waiting, key=lambda t: _fair(waiting[t][-1], per_tenant[t]))
        job = waiting[tenant].pop()
        if not waiting[tenant]:
            del waiting[tenant]
        chosen = next(
            ((rung, n) for rung in room if (n := device_count(job.size, rung)) is not None), None
        )
        if chosen is None:
            continue  # the rungs it fits are busy (create refused jobs that fit none)
        rung, count = chosen
        placements.append(Placement(job.id, rung, count))
        per_rung[rung.name] += 1
        per_tenant[tenant] += 1
    return placements


def _fair(job: QueuedJob, running: int) -> tuple[int, int, datetime, str]:
    """Whose next job takes a free place: urgent first, then the tenant running fewest."""
    priority, created, job_id = _order(job)
    return priority, running, created, job_id


def _order(job: QueuedJob) -> tuple[int, datetime, str]:
    return PRIORITY_ORDER.get(job.priority, 1), job.created_at, job.id


def _waiting(
    queued: Iterable[QueuedJob], busy: set[str], batch_may_start: bool
) -> dict[str, list[QueuedJob]]:
    """Each tenant's jobs that may start, its next one last (popped)."""
    waiting: dict[str, list[QueuedJob]] = {}
    for job in queued:
        if job.id in busy or (job.priority == "batch" and not batch_may_start):
            continue
        waiting.setdefault(job.tenant, []).append(job)
    for jobs in waiting.values():
        jobs.sort(key=_order, reverse=True)
    return waiting


def device_count(size: Size | None, rung: ProviderSpec) -> int | None:
    """The fewest of the rung's devices whose memory holds the job (1, 2, 4 ... and the rung's
    own count); None when no count does. A job that cannot be sized takes them all."""
    if size is None:
        return rung.device_count
    for count in _counts(rung.device_count):
        estimate = memory.training_memory(
            size.model,
            method=size.method,
            precision=memory.device_precision(rung.device),
            rows=size.rows,
            row_len=size.row_len,
            devices=count,
            lora_rank=size.lora_rank,
        )
        if memory.fits(estimate, rung.device_memory_gib):
            return count
    return None


def _counts(most: int) -> list[int]:
    counts = [1]
    while counts[-1] * 2 <= most:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == most else [*counts, most]


def size_of(
    model: str, plan: bytes | None, catalogue: Mapping[str, CatalogueEntry] = CATALOGUE
) -> Size | None:
    """The plan's rows a micro-batch, row length and method (JobRow.plan's `trainer` section);
    None for a model outside the catalogue or a plan without them."""
    entry = catalogue.get(model)
    trainer: dict[str, Any] = json.loads(plan or b"{}").get("trainer", {})
    hyper = trainer.get("hyperparameters", {})
    if entry is None or "micro_batch_size" not in hyper or "max_seq_len" not in hyper:
        return None
    return Size(
        entry,
        method=trainer.get("method", "lora"),
        rows=int(hyper["micro_batch_size"]),
        row_len=int(hyper["max_seq_len"]),
        lora_rank=int(trainer.get("lora", {}).get("rank", 16)),
    )
