"""Event subscribers of the scheduler: datasets built, evaluations, early stops, registrations.

Each validates (FastStream, from the event class), calls the Scheduler and returns; a raise is
retried by the bus with backoff (shared/redelivery.py), so every call is idempotent.
"""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.scheduler.lifecycle import Scheduler
from shared import bus
from shared.events import (
    BaseScored,
    BestCheckpointChanged,
    DatasetBuildFailed,
    DatasetBuilt,
    EvalCompleted,
    EvalDecided,
    JobEarlyStopRequested,
    ModelRegistered,
)

SERVICE = "scheduler"


def build_router(scheduler: Scheduler) -> NatsRouter:
    router = NatsRouter()

    @bus.subscribe(router, DatasetBuilt, service=SERVICE)
    async def dataset_built(event: DatasetBuilt) -> None:
        await scheduler.on_dataset_built(event)

    @bus.subscribe(router, DatasetBuildFailed, service=SERVICE)
    async def dataset_failed(event: DatasetBuildFailed) -> None:
        await scheduler.on_dataset_failed(event)

    @bus.subscribe(router, BaseScored, service=SERVICE)
    async def base_scored(event: BaseScored) -> None:
        await scheduler.on_eval(event)

    @bus.subscribe(router, EvalCompleted, service=SERVICE)
    async def eval_completed(event: EvalCompleted) -> None:
        await scheduler.on_eval(event)

    @bus.subscribe(router, BestCheckpointChanged, service=SERVICE)
    async def best_changed(event: BestCheckpointChanged) -> None:
        await scheduler.on_eval(event)

    @bus.subscribe(router, EvalDecided, service=SERVICE)
    async def decided(event: EvalDecided) -> None:
        await scheduler.on_eval(event)

    @bus.subscribe(router, JobEarlyStopRequested, service=SERVICE)
    async def early_stop(event: JobEarlyStopRequested) -> None:
        await scheduler.early_stop(event)

    @bus.subscribe(router, ModelRegistered, service=SERVICE)
    async def registered(event: ModelRegistered) -> None:
        await scheduler.on_registered(event)

    return router
