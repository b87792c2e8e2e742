"""Event subscribers of the evaluator service: validate, hand the fact to the runner, let it publish.

- job.planned -> store the plan and the fixed subset, score the base model (eval.base_scored)
- job.checkpoint_saved -> score it when due (eval.completed, eval.best_checkpoint_changed)
- job.training_completed -> the decision once every planned point is scored (eval.decided)
- job.failed / job.cancelled -> nothing more to score; the engine is given back
- deployment.served_name_changed -> which served names have a shadow to score (shadow.py)

One message per fetch: an evaluation takes seconds to minutes, and a message waiting in the
client behind it would pass its ack wait there. While one runs, the message is kept in hand
(`in_progress`) so JetStream does not hand it to another instance. A fault a retry can fix
raises and the bus redelivers with backoff; an event that can never be handled is a
PermanentError (dead-lettered).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from faststream.nats import NatsRouter
from faststream.nats.annotations import NatsMessage

from services.evaluator.runner import Evaluator
from services.evaluator.shadow import ShadowScorer
from shared import bus
from shared.events import (
    CheckpointSaved,
    JobCancelled,
    JobFailed,
    JobPlanned,
    ServedNameChanged,
    TrainingCompleted,
)
from shared.storage import parse_uri

SERVICE = "evaluator"


@contextlib.asynccontextmanager
async def kept_in_hand(msg: NatsMessage, every_s: float) -> AsyncIterator[None]:
    async def ping() -> None:
        while True:
            await asyncio.sleep(every_s)
            await msg.in_progress()

    task = asyncio.create_task(ping())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def check_uri(field: str, uri: str) -> None:
    """An s3:// URI, or the event can never be handled (a PermanentError naming the field)."""
    try:
        parse_uri(uri)
    except ValueError as exc:
        raise bus.PermanentError(f"{field}: {exc}") from None


def build_router(
    evaluator: Evaluator,
    *,
    service: str = SERVICE,
    keepalive_s: float = 20.0,
    shadow: ShadowScorer | None = None,
) -> NatsRouter:
    """The subscribers, on durable consumers named for `service` (tests pass their own)."""
    router = NatsRouter()

    if shadow is not None:
        scorer = shadow

        @bus.subscribe(router, ServedNameChanged, service=service)
        async def served_name_changed(event: ServedNameChanged) -> None:
            await scorer.served_name_changed(event)

    @bus.subscribe(router, JobPlanned, service=service, batch_size=1)
    async def job_planned(event: JobPlanned, msg: NatsMessage) -> None:
        check_uri("dataset_uri", event.dataset_uri)
        async with kept_in_hand(msg, keepalive_s):
            await evaluator.planned(event)

    @bus.subscribe(router, CheckpointSaved, service=service, batch_size=1)
    async def checkpoint_saved(event: CheckpointSaved, msg: NatsMessage) -> None:
        check_uri("uri", event.uri)
        async with kept_in_hand(msg, keepalive_s):
            await evaluator.checkpoint_saved(event)

    @bus.subscribe(router, TrainingCompleted, service=service, batch_size=1)
    async def training_completed(event: TrainingCompleted, msg: NatsMessage) -> None:
        if event.last_checkpoint_uri is not None:
            check_uri("last_checkpoint_uri", event.last_checkpoint_uri)
        async with kept_in_hand(msg, keepalive_s):
            await evaluator.training_completed(event)

    @bus.subscribe(router, JobFailed, service=service, batch_size=1)
    async def job_failed(event: JobFailed) -> None:
        await evaluator.ended(event.tenant, event.job_id)

    @bus.subscribe(router, JobCancelled, service=service, batch_size=1)
    async def job_cancelled(event: JobCancelled) -> None:
        await evaluator.ended(event.tenant, event.job_id)

    return router
