"""The decision once training has ended: which checkpoint, on whose scores, gated, and against
the version serving the job's served name.

Every planned point scored, a judged job's grader is settled first (judging.choose: the judge
while it is trusted, else the deterministic grader), the top checkpoints are re-scored on the
whole eval split on that grader's scores (rescoring.py), the best is gated (decision.py), and an
auto-deploying job's choice is scored against what serves its name now (serving_baseline.py).
Generation is the runner's (`Answer`): this module decides what is answered, not how.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from sqlalchemy.engine import Engine as DbEngine

from services.evaluator import decision, records, rescoring, scoring, serving_baseline
from services.evaluator.engine_client import Engine, HosterClient, HosterRefused, Serving
from services.evaluator.judging import Choice, Judging, deterministic_grader
from services.evaluator.models import EvalJobRow
from services.evaluator.subset import EvalItem
from shared.events import EvalDecided, Event
from shared.storage import ObjectStore
from shared.tasks import TaskKind

log = logging.getLogger("tuneloop.evaluator")


def serving_key(tenant: str, job_id: str, version: str) -> str:
    """Where the serving version's answers to the job's items are kept."""
    return f"tenants/{tenant}/jobs/{job_id}/evals/serving-{version}.jsonl"


class Answer(Protocol):
    """The runner's generation and grading (Evaluator.answer): `items` answered by `model` at
    `base_url`, graded as the job's (by the judge too unless `judged` is False), the outputs
    stored. (results, mean, outputs URI)"""

    def __call__(
        self,
        job: EvalJobRow,
        base_url: str,
        model: str,
        step: int,
        items: list[EvalItem] | None = None,
        part: str = "",
        key: str | None = None,
        judged: bool = True,
    ) -> Awaitable[tuple[list[scoring.ItemResult], float, str]]: ...


class Decider:
    def __init__(
        self,
        *,
        db: DbEngine,
        store: ObjectStore,
        hoster: HosterClient,
        publish: Callable[[Event], Awaitable[None]],
        judging: Judging | None,
        answer: Answer,
        engine_for: Callable[[EvalJobRow], Awaitable[Engine]],
        rescore_top: int,
        rescore_max_items: int,
        serving_margin: float,
    ) -> None:
        self.db, self.store, self.hoster, self.judging = db, store, hoster, judging
        self.publish_event = publish
        self.answer, self.engine_for = answer, engine_for
        self.rescore_top, self.rescore_max_items = rescore_top, rescore_max_items
        self.serving_margin = serving_margin

    async def decide(self, job: EvalJobRow) -> decision.Decision | None:
        """The job's decision once every planned point is scored and published (None before):
        who chooses (a judged job's judge, or the deterministic grader), the top checkpoints
        re-scored on the whole split on that grader's scores, the gate, and the version serving
        the job's served name scored on the same items."""
        assert job.last_step is not None
        rows = {p.step: p for p in await asyncio.to_thread(records.points, self.db, job.job_id)}
        last_uri = job.last_checkpoint_uri or (
            rows[job.last_step].checkpoint_uri if job.last_step in rows else job.artifact_uri or ""
        )
        evaluated = job.eval_every > 0 and job.eval_error is None
        planned = decision.planned_steps(
            eval_every=job.eval_every, last_step=job.last_step, last_saved=job.last_step in rows
        )
        if evaluated and any(s not in rows or not rows[s].published for s in planned):
            return None
        scores = {s: p.score for s, p in rows.items() if s in planned and p.score is not None}
        kind: TaskKind = job.task_kind  # type: ignore[assignment]
        uris = {s: p.checkpoint_uri for s, p in rows.items()}
        # A judged job: the judge chooses only while it is trusted (judging.choose); else the
        # deterministic scores of the same answers do, re-scored on the whole split as theirs.
        choice = None
        if self.judging is not None and evaluated:
            choice = await self.judging.choose(job, scores)
        chosen = choice.scores if choice is not None else scores
        rescored = await self._rescored(job, chosen, uris, choice) if evaluated else None
        made = decision.decide(
            kind=kind,
            eval_every=job.eval_every,
            scores=chosen if evaluated else {},
            uris=uris,
            base_score=choice.base_score if choice is not None else job.base_score,
            last_step=job.last_step,
            last_uri=last_uri,
            no_eval_reason=job.eval_error,
            rescored=rescored,
        )
        if self.judging is not None and choice is not None:
            made = self.judging.settle(made, choice)
        return await serving_baseline.against_serving(
            self.db, self.store, self.hoster, job, made,
            margin=self.serving_margin, max_items=self.rescore_max_items,
            score=lambda serving, items: self._score_serving(job, serving, items),
        )  # fmt: skip

    async def _score_serving(
        self, job: EvalJobRow, serving: Serving, items: list[EvalItem]
    ) -> tuple[list[scoring.ItemResult], str]:
        """The serving version's answers to `items`, graded as the job's: its checkpoint loaded
        in the job's eval engine (another base's engine for a version of another base, given
        back after), or the base itself when a catalogue base is what serves."""
        base = serving.base_model or serving.model
        own = base == job.base_model
        engine = (
            await self.engine_for(job)
            if own
            else await self.hoster.engine(tenant=job.tenant, job_id=job.job_id, base_model=base)
        )
        try:
            if serving.version_id is None:
                model = engine.base_model_name
            elif serving.checkpoint_uri is None:
                raise HosterRefused(f"version {serving.version_id} has no checkpoint URI")
            else:
                model = await self.hoster.load_checkpoint(
                    engine.engine_id, uri=serving.checkpoint_uri, step=0,
                    version_id=serving.version_id,
                )  # fmt: skip
            key = serving_key(job.tenant, job.job_id, serving.version_id or serving.model)
            results, _, uri = await self.answer(job, engine.base_url, model, 0, items, key=key)
        finally:
            if not own:
                await self.hoster.delete(engine.engine_id)
        return results, uri

    async def _rescored(
        self,
        job: EvalJobRow,
        scores: dict[int, float],
        uris: dict[int, str],
        choice: Choice | None,
    ) -> decision.Rescored | None:
        """The top checkpoints re-scored on the whole eval split (rescoring.py), on the scores
        that choose: a judged job's fallback grades the rest deterministically, asking no judge."""
        by_judge = choice is not None and choice.by_judge
        fell_back = choice is not None and not choice.by_judge

        async def score_rest(step: int, items: list[EvalItem]) -> tuple[list[float], str]:
            engine = await self.engine_for(job)
            model = await self.hoster.load_checkpoint(engine.engine_id, uri=uris[step], step=step)
            results, _, uri = await self.answer(
                job, engine.base_url, model, step, items, "-rest", judged=by_judge
            )
            return rescoring.verdict_scores((r.score, r.detail) for r in results), uri

        return await rescoring.rescore(
            self.db, self.store, job, scores,
            top=self.rescore_top, max_items=self.rescore_max_items, score_rest=score_rest,
            grader=rescoring.JUDGE if by_judge else rescoring.DETERMINISTIC,
            grader_words=f"deterministic {deterministic_grader(job.task_kind)}" if fell_back else "",
            reask=functools.partial(self.judging.reasked, job) if by_judge and self.judging else None,
        )  # fmt: skip

    async def publish(self, job: EvalJobRow) -> None:
        """eval.decided from the stored decision (its id the job's: published once)."""
        assert job.decision is not None
        made = json.loads(job.decision)
        await self.publish_event(
            EvalDecided(
                event_id=f"eval-{job.job_id}-decided",
                tenant=job.tenant,
                job_id=job.job_id,
                base_model=job.base_model,
                fine_tuned_model=job.fine_tuned_model,
                dataset_id=job.dataset_id,
                dataset_version=job.dataset_version,
                best_step=made["best_step"],
                best_checkpoint_uri=made["best_checkpoint_uri"],
                best_score=made["best_score"],
                base_score=made["base_score"],
                scores={int(s): v for s, v in made["scores"].items()},
                gate=made["gate"],
                gate_reason=made["gate_reason"],
                auto_deploy=job.auto_deploy,
                serving_version_id=made.get("serving_version_id"),
                serving_score=made.get("serving_score"),
                beats_serving=made.get("beats_serving"),
            )
        )
        await asyncio.to_thread(records.update_job, self.db, job.job_id, decision_published=True)
        job.decision_published = True
        log.info("job %s: decided step %s, gate %s", job.job_id, made["best_step"], made["gate"])
