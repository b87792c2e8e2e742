"""A job's evaluation, moved on by each event about it: the base score, each due checkpoint in step
order (after each, the overfit rule: overfit.py), then the decision (deciding.py: the top
checkpoints re-scored on the whole eval split first) and giving the engine back.

Every event first records its fact (the plan, a saved checkpoint, where training ended), then
calls `advance`, which does whatever is due and not done yet, one job at a time in this process.
Results are stored before their event is published, and events carry ids made from the job and
step, so a redelivered event or a restart mid-way re-publishes (deduplicated by the stream)
instead of scoring twice. A fault a retry can fix propagates, and the bus redelivers the event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from sqlalchemy.engine import Engine as DbEngine

from services.evaluator import decision, overfit, records, scoring
from services.evaluator.deciding import Decider
from services.evaluator.engine_client import (
    Engine,
    HosterClient,
    HosterRefused,
    generate,
)
from services.evaluator.judging import Judging
from services.evaluator.models import BASE_STEP, EvalJobRow, EvalPointRow
from services.evaluator.subset import EvalItem, SubsetError, build_subset
from shared.events import (
    BaseScored,
    BestCheckpointChanged,
    CheckpointSaved,
    EvalCompleted,
    Event,
    JobEarlyStopRequested,
    JobPlanned,
    TrainingCompleted,
)
from shared.redelivery import PermanentError
from shared.storage import ObjectStore
from shared.tasks import TaskKind

log = logging.getLogger("tuneloop.evaluator")
Publish = Callable[[Event], Awaitable[None]]
METRIC = "task_score"


class PlanNotKnown(RuntimeError):
    """An event about a job whose plan has not been stored yet (it is on its way): retry."""


def outputs_key(tenant: str, job_id: str, step: int, part: str = "") -> str:
    name = "base" if step == BASE_STEP else f"step-{step:08d}"
    return f"tenants/{tenant}/jobs/{job_id}/evals/{name}{part}.jsonl"


def _same_tenant(job: EvalJobRow | None, tenant: str) -> None:
    if job is not None and job.tenant != tenant:
        raise PermanentError(f"tenant: job {job.job_id} is not tenant {tenant!r}'s")


class Evaluator:
    def __init__(
        self,
        *,
        db: DbEngine,
        store: ObjectStore,
        hoster: HosterClient,
        publish: Publish,
        concurrency: int = 8,
        request_timeout_s: float = 300.0,
        overfit_rule: overfit.Rule | None = None,
        rescore_top: int = 3,
        rescore_max_items: int = 200,
        judging: Judging | None = None,
        serving_margin: float = 0.0,
    ) -> None:
        self.db, self.store, self.hoster, self.publish = db, store, hoster, publish
        self.concurrency, self.request_timeout_s = concurrency, request_timeout_s
        self.overfit_rule = overfit_rule or overfit.Rule()
        self._locks: dict[str, asyncio.Lock] = {}
        self.judging = judging  # the LLM judge (judging.py); None: deterministic graders only
        self.decider = Decider(
            db=db, store=store, hoster=hoster, publish=publish, judging=judging, answer=self.answer,
            engine_for=self._engine, rescore_top=rescore_top,
            rescore_max_items=rescore_max_items, serving_margin=serving_margin,
        )  # fmt: skip

    # --- facts ------------------------------------------------------------------------------

    async def planned(self, event: JobPlanned) -> None:
        if await asyncio.to_thread(records.get_job, self.db, event.job_id) is None:
            items, error = [], None
            if event.eval_every > 0:
                try:
                    items = await asyncio.to_thread(
                        build_subset,
                        self.store,
                        dataset_uri=event.dataset_uri,
                        dataset_version=event.dataset_version,
                        eval_items=event.eval_items,
                    )
                except SubsetError as exc:
                    error = f"no eval subset: {exc}"
                    log.warning("job %s: %s", event.job_id, error)
            await asyncio.to_thread(records.create_job, self.db, event, items, error)
        if self.judging is not None:
            await self.judging.prepare(event.job_id)
        await self.advance(event.job_id)

    async def checkpoint_saved(self, event: CheckpointSaved) -> None:
        _same_tenant(await asyncio.to_thread(records.get_job, self.db, event.job_id), event.tenant)
        loss = event.metrics.get("loss")
        await asyncio.to_thread(
            records.add_point, self.db, event.job_id, event.step, event.uri, loss
        )
        await self.advance(event.job_id)

    async def training_completed(self, event: TrainingCompleted) -> None:
        job = await asyncio.to_thread(records.get_job, self.db, event.job_id)
        if job is None:
            raise PlanNotKnown(f"job {event.job_id}: training completed before its plan arrived")
        _same_tenant(job, event.tenant)
        if event.last_checkpoint_uri is not None:
            await asyncio.to_thread(
                records.add_point, self.db, event.job_id, event.last_step, event.last_checkpoint_uri
            )
        if job.last_step is None:
            await asyncio.to_thread(
                records.update_job,
                self.db,
                event.job_id,
                last_step=event.last_step,
                last_checkpoint_uri=event.last_checkpoint_uri,
                artifact_uri=event.artifact_uri,
            )
        await self.advance(event.job_id)

    async def ended(self, tenant: str, job_id: str) -> None:
        """The job failed or was cancelled: nothing more to score; give its engine back."""
        async with self._lock(job_id):
            job = await asyncio.to_thread(records.get_job, self.db, job_id)
            _same_tenant(job, tenant)
            if job is not None and not job.closed:
                await self._close(job)

    # --- the work ---------------------------------------------------------------------------

    def _lock(self, job_id: str) -> asyncio.Lock:
        return self._locks.setdefault(job_id, asyncio.Lock())

    async def advance(self, job_id: str) -> None:
        async with self._lock(job_id):
            job = await asyncio.to_thread(records.get_job, self.db, job_id)
            if job is None or job.closed:
                return
            if job.eval_every > 0 and job.eval_error is None:
                try:
                    await self._score_due(job)
                except HosterRefused as exc:
                    error = f"the hoster refused the eval engine: {exc}"
                    log.warning("job %s: %s", job_id, error)
                    await asyncio.to_thread(records.update_job, self.db, job_id, eval_error=error)
                job = await asyncio.to_thread(records.get_job, self.db, job_id)
                assert job is not None
            await self._decide_if_ready(job)

    async def _score_due(self, job: EvalJobRow) -> None:
        if job.base_score is None:
            await self._score_base(job)
        elif not job.base_published:
            await self._publish_base(job)
        while True:
            await self._stop_if_overfitting(job)
            last_step = job.last_step if job.last_step is not None else job.steps
            rows = await asyncio.to_thread(records.points, self.db, job.job_id)
            pending = [
                p
                for p in rows
                if not p.published
                and decision.is_due(p.step, eval_every=job.eval_every, last_step=last_step)
            ]
            if not pending:
                return
            point = pending[0]  # in step order
            # Events saved at once overtake each other: an earlier step on the cadence not
            # recorded yet is on its way, and goes first (the decision waits for it anyway).
            recorded = {p.step for p in rows}
            if any(s not in recorded for s in range(job.eval_every, point.step, job.eval_every)):
                return
            if point.score is None:
                await self._score_point(job, point)
            await self._publish_point(job, point.step)

    async def _engine(self, job: EvalJobRow) -> Engine:
        engine = await self.hoster.engine(
            tenant=job.tenant, job_id=job.job_id, base_model=job.base_model
        )
        if job.engine_id != engine.engine_id:
            await asyncio.to_thread(
                records.update_job, self.db, job.job_id, engine_id=engine.engine_id
            )
            job.engine_id = engine.engine_id
        return engine

    async def answer(
        self,
        job: EvalJobRow,
        base_url: str,
        model: str,
        step: int,
        items: list[EvalItem] | None = None,
        part: str = "",
        key: str | None = None,
        judged: bool = True,
    ) -> tuple[list[scoring.ItemResult], float, str]:
        """Generate and grade the subset (or `items`), by the judge too for a judged job unless
        `judged` is False; store the outputs as JSONL (the key's `part` after the step, or
        `key`). (results, mean, uri)"""
        if items is None:
            items = await asyncio.to_thread(records.items, self.db, job.job_id)
        outputs = await generate(
            base_url,
            model,
            items,
            concurrency=self.concurrency,
            timeout_s=self.request_timeout_s,
        )
        kind: TaskKind = job.task_kind  # type: ignore[assignment]  # stored from a TaskKind
        results = scoring.grade(kind, items, outputs)
        score = scoring.mean_score(results)
        if self.judging is not None and judged:
            results, score = await self.judging.grade(job, results, score)
        key = key or outputs_key(job.tenant, job.job_id, step, part)
        body = scoring.outputs_jsonl(results)
        await asyncio.to_thread(self.store.put_bytes, key, body, content_type="application/jsonl")
        return results, score, self.store.uri(key)

    async def _score_base(self, job: EvalJobRow) -> None:
        engine = await self._engine(job)
        results, score, uri = await self.answer(
            job, engine.base_url, engine.base_model_name, BASE_STEP
        )
        await asyncio.to_thread(
            records.store_base, self.db, job.job_id, BASE_STEP, results, score, uri
        )
        job.base_score, job.base_outputs_uri = score, uri
        log.info("job %s: base model %s scored %.3f", job.job_id, job.base_model, score)
        await self._publish_base(job)

    async def _publish_base(self, job: EvalJobRow) -> None:
        assert job.base_score is not None
        count = len(await asyncio.to_thread(records.items, self.db, job.job_id))
        await self.publish(
            BaseScored(
                event_id=f"eval-{job.job_id}-base",
                tenant=job.tenant,
                job_id=job.job_id,
                base_model=job.base_model,
                score=job.base_score,
                sample_count=count,
                outputs_uri=job.base_outputs_uri,
            )
        )
        await asyncio.to_thread(records.update_job, self.db, job.job_id, base_published=True)
        job.base_published = True

    async def _score_point(self, job: EvalJobRow, point: EvalPointRow) -> None:
        engine = await self._engine(job)
        model = await self.hoster.load_checkpoint(
            engine.engine_id, uri=point.checkpoint_uri, step=point.step
        )
        started = time.monotonic()
        results, score, uri = await self.answer(job, engine.base_url, model, point.step)
        duration = time.monotonic() - started
        scored = await self._scores(job.job_id)
        before = decision.best_of({s: v for s, v in scored.items() if s != point.step})
        after = decision.best_of({**scored, point.step: score})
        moved = after is not None and after[0] == point.step and before != after
        await asyncio.to_thread(
            records.store_point,
            self.db,
            job.job_id,
            point.step,
            results,
            score=score,
            uri=uri,
            duration_s=duration,
            best_changed=moved,
        )
        log.info("job %s: step %d scored %.3f in %.1fs", job.job_id, point.step, score, duration)

    async def _scores(self, job_id: str) -> dict[int, float]:
        rows = await asyncio.to_thread(records.points, self.db, job_id)
        return {p.step: p.score for p in rows if p.score is not None}

    async def _publish_point(self, job: EvalJobRow, step: int) -> None:
        rows = {p.step: p for p in await asyncio.to_thread(records.points, self.db, job.job_id)}
        point = rows[step]
        assert point.score is not None
        count = len(await asyncio.to_thread(records.items, self.db, job.job_id))
        await self.publish(
            EvalCompleted(
                event_id=f"eval-{job.job_id}-step-{step}",
                tenant=job.tenant,
                job_id=job.job_id,
                checkpoint_uri=point.checkpoint_uri,
                step=step,
                scores={METRIC: point.score},
                sample_count=count,
                outputs_uri=point.outputs_uri,
            )
        )
        if point.best_changed:
            others = {s: p.score for s, p in rows.items() if p.score is not None and s != step}
            previous = decision.best_of(others)
            await self.publish(
                BestCheckpointChanged(
                    event_id=f"eval-{job.job_id}-best-{step}",
                    tenant=job.tenant,
                    job_id=job.job_id,
                    checkpoint_uri=point.checkpoint_uri,
                    step=step,
                    metric=METRIC,
                    value=point.score,
                    previous_uri=rows[previous[0]].checkpoint_uri if previous else None,
                )
            )
        await asyncio.to_thread(records.mark_published, self.db, job.job_id, step)

    async def _stop_if_overfitting(self, job: EvalJobRow) -> None:
        """While training runs, ask the scheduler to end it once the overfit rule holds
        (overfit.py): the reason is stored first, and the request's id is the job's, so a
        redelivery or a restart publishes it once."""
        if job.early_stop_published:
            return
        fresh = await asyncio.to_thread(records.get_job, self.db, job.job_id)
        if fresh is None or fresh.last_step is not None:
            return  # training has ended: nothing left to stop
        reason = fresh.early_stop_reason
        if reason is None:
            rows = await asyncio.to_thread(records.points, self.db, job.job_id)
            scored = [
                overfit.Scored(p.step, p.score, p.train_loss) for p in rows if p.score is not None
            ]
            reason = overfit.overfitting(scored, self.overfit_rule)
            if reason is None:
                return
            await asyncio.to_thread(
                records.update_job, self.db, job.job_id, early_stop_reason=reason
            )
            log.info("job %s: early stop: %s", job.job_id, reason)
        await self.publish(
            JobEarlyStopRequested(
                event_id=f"eval-{job.job_id}-early-stop",
                tenant=job.tenant,
                job_id=job.job_id,
                reason=reason,
            )
        )
        await asyncio.to_thread(records.update_job, self.db, job.job_id, early_stop_published=True)
        job.early_stop_reason, job.early_stop_published = reason, True

    # --- the decision -----------------------------------------------------------------------

    async def _decide_if_ready(self, job: EvalJobRow) -> None:
        if job.last_step is None:
            return  # training has not ended
        if job.decision is None:
            made = await self.decider.decide(job)
            if made is None:
                return  # a planned point is not scored yet
            document = json.dumps(asdict(made)).encode()
            await asyncio.to_thread(records.update_job, self.db, job.job_id, decision=document)
            job.decision = document
        if not job.decision_published:
            await self.decider.publish(job)
        await self._close(job)

    async def _close(self, job: EvalJobRow) -> None:
        if job.engine_id is not None:
            await self.hoster.delete(job.engine_id)
        await asyncio.to_thread(records.update_job, self.db, job.job_id, closed=True)
        job.closed = True
