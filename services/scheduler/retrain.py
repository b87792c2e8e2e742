"""Retrain policies: a tenant's rule for training the next version from the traffic it goes on
capturing, so the model gets better over time without anyone starting a job.

A policy names the samples (ingest's dataset `source` filter: the platform's own judge, shadow
and eval traffic is left out unless named; feedback filters keep only well-rated answers), a
trigger (N new samples, and/or a schedule that runs only when something new arrived), a job
template and `auto_deploy`. Every `TUNELOOP_SCHEDULER_RETRAIN_INTERVAL_S` the scheduler counts
each enabled policy's new samples (captured since its last run) and, when due and its last job
has ended, runs it: a dataset of everything the filter selects up to now is built by ingest, a
job on it is accepted as any other (the same checks, the tenant's budget included) and
`job.retrain_triggered` says so; the job's own events and the evaluator's gate follow, and with
`auto_deploy` a version that passes the gate is deployed. One run at a time per policy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.scheduler import jobs
from services.scheduler.jobs import JobError
from services.scheduler.lifecycle import Scheduler
from services.scheduler.models import JobRow, RetrainPolicyRow
from services.scheduler.protocol import (
    TERMINAL,
    JobCreate,
    RetrainPolicy,
    RetrainPolicyCreate,
    RetrainPolicyUpdate,
    RetrainTrigger,
)
from services.scheduler.traffic import Traffic, TrafficRefused
from shared.db import session_scope, utcnow
from shared.events import Event, RetrainTriggered

log = logging.getLogger("tuneloop.scheduler.retrain")
Publish = Callable[[Event], Awaitable[None]]
POLICY_KEY = "retrain_policy"  # the job's metadata naming the policy that started it
MAX_METADATA = 16  # OpenAI's limit on a job's metadata pairs


def due(trigger: RetrainTrigger, new: int, last_run: datetime | None, now: datetime) -> str | None:
    """Why the policy runs now, or None."""
    if trigger.min_new_samples is not None and new >= trigger.min_new_samples:
        return f"{new} new samples (the trigger is {trigger.min_new_samples})"
    waited = last_run is None or (now - last_run).total_seconds() >= (trigger.every_s or 0)
    if trigger.every_s is not None and new > 0 and waited:
        return f"its schedule (every {trigger.every_s:g} s) with {new} new samples"
    return None


@dataclass
class Retrainer:
    engine: Engine
    scheduler: Scheduler
    traffic: Traffic
    publish: Publish
    # One run decision at a time: the loop and a `run` request must not both start one.
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    # --- the API ----------------------------------------------------------------------------

    async def create(self, tenant: str, body: RetrainPolicyCreate) -> RetrainPolicy:
        self.scheduler.check_model(body.job.model, tenant=tenant, param="job.model")
        if len(body.job.metadata or {}) >= MAX_METADATA:
            raise JobError(
                422,
                f"job.metadata: at most {MAX_METADATA - 1} pairs (each job gets "
                f"{POLICY_KEY!r} too)",
                param="job.metadata",
            )
        try:
            await self.traffic.validate(tenant, dataset_spec(body, name=f"{body.name}-1"))
        except TrafficRefused as exc:
            raise _job_error(exc) from None

        def insert() -> RetrainPolicyRow:
            with session_scope(self.engine) as session:
                row = RetrainPolicyRow(
                    id=f"rp_{uuid.uuid4().hex[:24]}",
                    tenant=tenant,
                    name=body.name,
                    enabled=body.enabled,
                    spec=jobs.dumps(body.model_dump(mode="json", exclude_none=True)),
                    watermark=(
                        None
                        if body.new_since is None
                        else datetime.fromtimestamp(body.new_since, UTC)
                    ),
                )
                session.add(row)
                try:
                    session.commit()
                except sa.exc.IntegrityError:
                    raise JobError(
                        409, f"name: a retrain policy named {body.name!r} exists", param="name"
                    ) from None
                session.refresh(row)
                return row

        return to_api(await asyncio.to_thread(insert))

    def policies(self, tenant: str) -> list[RetrainPolicy]:
        with session_scope(self.engine) as session:
            rows = session.exec(
                select(RetrainPolicyRow)
                .where(RetrainPolicyRow.tenant == tenant)
                .order_by(col(RetrainPolicyRow.created_at), col(RetrainPolicyRow.id))
            ).all()
            return [to_api(row) for row in rows]

    def get(self, tenant: str, policy_id: str) -> RetrainPolicy:
        with session_scope(self.engine) as session:
            return to_api(_owned(session, tenant, policy_id))

    def update(self, tenant: str, policy_id: str, body: RetrainPolicyUpdate) -> RetrainPolicy:
        with session_scope(self.engine) as session:
            row = _owned(session, tenant, policy_id)
            spec = json.loads(row.spec)
            if body.trigger is not None:
                spec["trigger"] = body.trigger.model_dump(mode="json", exclude_none=True)
            if body.auto_deploy is not None:
                spec["auto_deploy"] = body.auto_deploy
            if body.enabled is not None:
                row.enabled = spec["enabled"] = body.enabled
            row.spec, row.updated_at = jobs.dumps(spec), utcnow()
            session.add(row)
            session.commit()
            session.refresh(row)
            return to_api(row)

    def delete(self, tenant: str, policy_id: str) -> None:
        """The policy goes; the datasets and jobs it started stay."""
        with session_scope(self.engine) as session:
            session.delete(_owned(session, tenant, policy_id))
            session.commit()

    async def run_now(self, tenant: str, policy_id: str) -> RetrainPolicy:
        """Run the policy now whatever its trigger says (409 while its last job runs)."""
        async with self._lock:
            row = await asyncio.to_thread(self._load, policy_id)
            if row is None or row.tenant != tenant:
                raise JobError(404, f"retrain policy {policy_id!r} not found", param="policy_id")
            if await asyncio.to_thread(self._in_flight, row):
                raise JobError(
                    409,
                    f"retrain policy {row.name!r}: its job {row.last_job_id} has not ended",
                    param="policy_id",
                )
            spec = RetrainPolicyCreate.model_validate_json(row.spec)
            new = await self._new_samples(row, spec)
            await self._fire(row, spec, "run by request", new, refuse=True)
            return self.get(tenant, policy_id)

    # --- the loop -----------------------------------------------------------------------------

    async def check(self) -> None:
        """Run every enabled policy that is due and whose last job has ended."""
        for policy_id in await asyncio.to_thread(self._enabled):
            async with self._lock:
                try:
                    await self._consider(policy_id)
                except Exception:  # ingest away, say: tried again next round
                    log.exception("retrain policy %s: checking failed", policy_id)

    async def _consider(self, policy_id: str) -> None:
        row = await asyncio.to_thread(self._load, policy_id)
        if row is None or not row.enabled or await asyncio.to_thread(self._in_flight, row):
            return
        spec = RetrainPolicyCreate.model_validate_json(row.spec)
        new = await self._new_samples(row, spec)
        reason = due(spec.trigger, new, row.last_run_at, utcnow())
        if reason is not None:
            await self._fire(row, spec, reason, new, refuse=False)

    async def _new_samples(self, row: RetrainPolicyRow, spec: RetrainPolicyCreate) -> int:
        try:
            return await self.traffic.count(row.tenant, spec.source, row.watermark)
        except TrafficRefused as exc:
            raise _job_error(exc) from None

    async def _fire(
        self,
        row: RetrainPolicyRow,
        spec: RetrainPolicyCreate,
        reason: str,
        new: int,
        *,
        refuse: bool,
    ) -> None:
        """Build the dataset and accept its job; what stops it is kept as the policy's
        `last_error` (and raised to a `run` request: `refuse`)."""
        cutoff = utcnow()
        run = row.runs + 1
        try:
            await self.scheduler.check_new_job(spec.job.model, tenant=row.tenant)
            dataset = await self.traffic.build(
                row.tenant, dataset_spec(spec, name=f"{spec.name}-{run}", until=cutoff)
            )
            metadata = {**(spec.job.metadata or {}), POLICY_KEY: row.id}
            request = JobCreate(
                **spec.job.model_dump(exclude_none=True, exclude={"metadata"}),
                metadata=metadata,
                training_file=dataset.id,
                auto_deploy=spec.auto_deploy,
            )
            job_id = jobs.new_job_id()
            note = f"Started by retrain policy {spec.name!r} (run {run}): {reason}"
            await self.scheduler.accept(
                job_id, request, tenant=row.tenant, dataset=dataset, note=note
            )
        except (JobError, TrafficRefused) as exc:
            said = f"run {run} did not start: {exc}"
            log.warning("retrain policy %s (%s): %s", row.id, row.tenant, said)
            await asyncio.to_thread(self._record_error, row.id, said)
            if refuse:
                raise exc if isinstance(exc, JobError) else _job_error(exc) from None
            return
        await asyncio.to_thread(self._record_run, row.id, cutoff, dataset.id, job_id)
        await self.publish(
            RetrainTriggered(
                tenant=row.tenant,
                policy_id=row.id,
                policy_name=spec.name,
                reason=reason,
                new_samples=new,
                dataset_id=dataset.id,
                job_id=job_id,
            )
        )
        # Built between the request and the job's row: `dataset.built` found no job waiting.
        await self.scheduler.dataset_status(
            job_id, await self.traffic.dataset(row.tenant, dataset.id)
        )

    # --- rows -----------------------------------------------------------------------------------

    def _enabled(self) -> list[str]:
        with session_scope(self.engine) as session:
            return list(
                session.exec(
                    select(RetrainPolicyRow.id).where(col(RetrainPolicyRow.enabled).is_(True))
                ).all()
            )

    def _load(self, policy_id: str) -> RetrainPolicyRow | None:
        with session_scope(self.engine) as session:
            return session.get(RetrainPolicyRow, policy_id)

    def _in_flight(self, row: RetrainPolicyRow) -> bool:
        if row.last_job_id is None:
            return False
        with session_scope(self.engine) as session:
            job = session.get(JobRow, row.last_job_id)
            return job is not None and job.status not in TERMINAL

    def _record_error(self, policy_id: str, said: str) -> None:
        with session_scope(self.engine) as session:
            row = session.get(RetrainPolicyRow, policy_id)
            if row is not None:
                row.last_error = said[:2000]
                session.add(row)
                session.commit()

    def _record_run(self, policy_id: str, cutoff: datetime, dataset_id: str, job_id: str) -> None:
        with session_scope(self.engine) as session:
            row = session.get(RetrainPolicyRow, policy_id)
            if row is None:
                return
            row.runs += 1
            row.watermark = row.last_run_at = cutoff
            row.last_dataset_id, row.last_job_id, row.last_error = dataset_id, job_id, None
            session.add(row)
            session.commit()


def dataset_spec(
    spec: RetrainPolicyCreate, *, name: str, until: datetime | None = None
) -> dict[str, Any]:
    """Ingest's dataset request for a run: everything the filter selects up to `until` (the
    run's cutoff, unless the filter ends earlier), for the job's base model."""
    source = dict(spec.source)
    if until is not None and "until" not in source:
        source["until"] = until.isoformat()
    body: dict[str, Any] = {"name": name, "base_model": spec.job.model, "source": source}
    for option in ("cleaning", "split"):
        if (value := getattr(spec, option)) is not None:
            body[option] = value
    return body


def to_api(row: RetrainPolicyRow) -> RetrainPolicy:
    spec = json.loads(row.spec)
    return RetrainPolicy(
        id=row.id,
        name=row.name,
        enabled=row.enabled,
        created_at=int(row.created_at.timestamp()),
        source=spec.get("source", {}),
        cleaning=spec.get("cleaning"),
        split=spec.get("split"),
        trigger=RetrainTrigger.model_validate(spec["trigger"]),
        job=spec["job"],
        auto_deploy=bool(spec.get("auto_deploy", False)),
        watermark=int(row.watermark.timestamp()) if row.watermark else None,
        runs=row.runs,
        last_run_at=int(row.last_run_at.timestamp()) if row.last_run_at else None,
        last_dataset_id=row.last_dataset_id,
        last_job_id=row.last_job_id,
        last_error=row.last_error,
    )


def _owned(session: Session, tenant: str, policy_id: str) -> RetrainPolicyRow:
    row = session.get(RetrainPolicyRow, policy_id)
    if row is None or row.tenant != tenant:  # another tenant's is as absent as a missing one
        raise JobError(404, f"retrain policy {policy_id!r} not found", param="policy_id")
    return row


def _job_error(exc: TrafficRefused) -> JobError:
    """Ingest's refusal as the API's: its 4xx kept (the field named), anything else a 502."""
    if 400 <= exc.status < 500:
        return JobError(exc.status, str(exc), param=exc.field)
    return JobError(502, f"the ingest service could not answer: {exc}")
