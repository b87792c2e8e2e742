"""The judge in a job's evaluation: which jobs it grades, its rubric, each answer's verdict, how
far people agree with it, and whether it or the deterministic grader chooses the checkpoint.

A job is judged when a judge is configured and its task kind is one the judge grades (free
text by default; exact graders stay for JSON, labels and tool calls): decided once, at its plan,
when the dataset version's rubric is written if it has none. Each answer's deterministic grade
is kept beside the verdict, so the decision can fall back to it: the judge chooses only while it
is trusted (calibration.py) and gave a verdict at every point; otherwise the deterministic scores
choose, and the decision's text says why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine as DbEngine

from services.evaluator import decision, judge_records, records
from services.evaluator.calibration import Agreement, Pair, agreement
from services.evaluator.config import JudgeSettings
from services.evaluator.gate import judge_gate
from services.evaluator.graders import Answer
from services.evaluator.judge import JudgeClient, ModelGrade, grade
from services.evaluator.models import BASE_STEP, EvalJobRow, JudgeRubricRow
from services.evaluator.rubric import (
    PASS_THRESHOLD,
    SCALE,
    item_namespace,
    sample_namespace,
    task_grader,
    write,
)
from services.evaluator.scoring import ItemResult
from services.evaluator.subset import EvalItem

log = logging.getLogger("tuneloop.evaluator.judge")
DETERMINISTIC = {
    "free_text": "ROUGE-L",
    "json": "per-field JSON",
    "short_label": "exact-label",
    "tool_calls": "tool-call",
}


@dataclass(frozen=True)
class PointJudgement:
    """A point's answers as the judge and the deterministic grader saw them."""

    step: int
    judge_score: float | None  # the mean over the answers with a verdict; None: no verdict
    deterministic_score: float
    verdicts: int
    judge_errors: int
    rubric_versions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Calibration:
    agreement: Agreement
    rubric_version: str | None
    judge_model: str | None
    unjudged: int = 0  # labels whose answer has no verdict (a judge_error, or no judge)


def summarise(step: int, rows: list[tuple[Any, Any]]) -> PointJudgement:
    """A point's judgement from its stored results ((item row, result row) pairs). An answer
    the engine refused has no verdict and scores 0 under either grader."""
    scores, deterministic, verdicts, errors, versions = [], [], 0, 0, set()
    for _, result in rows:
        detail = json.loads(result.detail)
        deterministic.append(float(detail.get("deterministic", {}).get("score", result.score)))
        if "judge_error" in detail:
            errors += 1
            continue
        if "judge" in detail:
            verdicts += 1
            versions.add(str(detail["judge"]["rubric_version"]))
        scores.append(float(result.score))
    mean = sum(scores) / len(scores) if verdicts else None
    det = sum(deterministic) / len(deterministic) if deterministic else 0.0
    return PointJudgement(step, mean, det, verdicts, errors, sorted(versions))


def _unjudged(points: dict[int, PointJudgement], steps: list[int]) -> str:
    """Words on the answers the judge could not grade, which the means leave out ('' if none)."""
    counted = {s: points[s].judge_errors for s in steps if s in points and points[s].judge_errors}
    if not counted:
        return ""
    where = ", ".join(f"{n} at step {s}" for s, n in sorted(counted.items()))
    return f" ({sum(counted.values())} answers had no verdict, judge_error, left out: {where})"


class Judging:
    def __init__(
        self,
        *,
        db: DbEngine,
        client: JudgeClient | None,
        model: str | None,
        kinds: Collection[str] = ("free_text",),
        rubric_items: int = 6,
    ) -> None:
        self.db, self.client, self.model = db, client, model
        self.kinds, self.rubric_items = set(kinds), rubric_items

    @classmethod
    def from_settings(cls, db: DbEngine, settings: JudgeSettings) -> Judging:
        client = None
        if settings.configured:
            assert settings.base_url is not None
            client = JudgeClient(
                base_url=settings.base_url,
                api_key=settings.api_key.get_secret_value() or "none",
                purpose=settings.purpose or None,
                concurrency=settings.concurrency,
                timeout_s=settings.timeout_s,
                max_retries=settings.max_retries,
                backoff_s=settings.backoff_s,
                max_backoff_s=settings.max_backoff_s,
                max_tokens=settings.max_tokens,
                cache=judge_records.DbVerdictCache(db),
            )
        return cls(
            db=db,
            client=client,
            model=settings.model,
            kinds=settings.kinds,
            rubric_items=settings.rubric_items,
        )

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def applies(self, task_kind: str) -> bool:
        return self.client is not None and self.model is not None and task_kind in self.kinds

    # --- the plan: rubric, and the job marked judged ----------------------------------------

    async def prepare(self, job_id: str) -> None:
        """Mark the job judged (once) when the judge grades its kind, writing the dataset
        version's rubric first when it has none."""
        job = await asyncio.to_thread(records.get_job, self.db, job_id)
        if job is None or job.eval_every <= 0 or job.eval_error is not None:
            return
        if not self.applies(job.task_kind):
            return
        if await asyncio.to_thread(judge_records.judged_job, self.db, job_id) is not None:
            return
        items = await asyncio.to_thread(records.items, self.db, job_id)
        await self.ensure_rubric(job.tenant, job.dataset_version, items)
        assert self.model is not None
        await asyncio.to_thread(
            judge_records.mark_judged,
            self.db,
            job_id=job_id,
            tenant=job.tenant,
            dataset_version=job.dataset_version,
            model=self.model,
        )

    async def ensure_rubric(
        self, tenant: str, dataset_version: str, items: list[EvalItem]
    ) -> JudgeRubricRow:
        """The current rubric; written by the judge from `items` when there is none, or when
        the current one is the default template (the judge failed before: try once more)."""
        latest = await asyncio.to_thread(
            judge_records.latest_rubric, self.db, tenant, dataset_version
        )
        if latest is not None and latest.source != "default":
            return latest
        assert self.client is not None
        assert self.model is not None
        rubric, source, note = await write(
            self.client, model=self.model, items=items[: self.rubric_items]
        )
        if latest is not None and source == "default":
            return latest  # still no better than the one stored
        log.info("rubric for %s: %s (%s)", dataset_version, source, note or "written by the judge")
        return await asyncio.to_thread(
            lambda: judge_records.add_rubric(
                self.db,
                tenant=tenant,
                dataset_version=dataset_version,
                rubric=rubric,
                source=source,
                note=note,
                judge_model=self.model,
                after=latest.version if latest is not None else None,
            )
        )

    # --- a point's answers ------------------------------------------------------------------

    async def judge_answer(
        self, tenant: str, row: JudgeRubricRow, item: EvalItem, answer: Answer
    ) -> ModelGrade:
        assert self.client is not None
        assert self.model is not None
        rubric = judge_records.rubric_of(row)
        return await grade(
            self.client,
            task_grader(self.model),
            tenant=tenant,
            item=item_namespace(item, rubric),
            sample=sample_namespace(answer),
            rubric=judge_records.rubric_id(row.dataset_version, row.version),
        )

    async def grade(
        self, job: EvalJobRow, results: list[ItemResult], mean: float
    ) -> tuple[list[ItemResult], float]:
        """For a judged job, each answer's verdict as its score (the deterministic grade kept in
        its detail) and the mean over the answers with a verdict; a judge_error is recorded on
        its item and left out of the mean. Other jobs' results come back as they are."""
        if self.client is None:
            return results, mean
        judged = await asyncio.to_thread(judge_records.judged_job, self.db, job.job_id)
        if judged is None:
            return results, mean
        row = await asyncio.to_thread(
            judge_records.latest_rubric, self.db, job.tenant, job.dataset_version
        )
        if row is None:  # written at the plan; gone only if the table was emptied since
            row = await self.ensure_rubric(
                job.tenant, job.dataset_version, [r.item for r in results]
            )
        version = judge_records.rubric_id(row.dataset_version, row.version)

        async def one(r: ItemResult) -> ItemResult:
            if r.output.error is not None:
                return r  # no answer to judge: it scores 0, as with any grader
            g = await self.judge_answer(job.tenant, row, r.item, r.output.answer)
            kept = {"score": r.score, **r.detail}
            if g.error is not None:
                output = dataclasses.replace(r.output, error=f"judge_error: {g.error}")
                detail = {"judge_error": g.error, "rubric_version": version, "deterministic": kept}
                return ItemResult(r.item, output, 0.0, detail)
            verdict = {
                "score": g.value,
                "scale": list(SCALE),
                "assessment": g.assessment,
                "rubric_version": version,
                "model": self.model,
                "cached": g.cached,
                "attempts": g.attempts,
            }
            assert g.score is not None
            return ItemResult(r.item, r.output, g.score, {"judge": verdict, "deterministic": kept})

        judged_results = list(await asyncio.gather(*(one(r) for r in results)))
        errors = sum(1 for r in judged_results if "judge_error" in r.detail)
        counted = [r.score for r in judged_results if "judge_error" not in r.detail]
        if errors:
            log.warning("job %s: %d judge_error(s) of %d answers", job.job_id, errors, len(results))
        if not any("judge" in r.detail for r in judged_results):
            return judged_results, mean  # no verdict at all: the decision falls back
        return judged_results, sum(counted) / len(counted)

    async def points(self, job_id: str, steps: list[int]) -> dict[int, PointJudgement]:
        out = {}
        for step in steps:
            rows = await asyncio.to_thread(records.results, self.db, job_id, step)
            if rows:
                out[step] = summarise(step, rows)
        return out

    # --- calibration ------------------------------------------------------------------------

    async def calibration(self, tenant: str, dataset_version: str) -> Calibration:
        """People's labels on this dataset version's answers against the judge's verdicts
        under the current rubric (cached verdicts mostly; an edited rubric asks again)."""
        labels = await asyncio.to_thread(judge_records.labels_of, self.db, tenant, dataset_version)
        row = await asyncio.to_thread(judge_records.latest_rubric, self.db, tenant, dataset_version)
        version = judge_records.rubric_id(dataset_version, row.version) if row else None
        if row is None or self.client is None:
            why = "no judge is configured" if self.client is None else "no rubric yet"
            none = Agreement("not enough labels", 0, None, None, None, why)
            return Calibration(none, version, self.model, unjudged=len(labels))
        answers: dict[str, dict[int, tuple[EvalItem, Answer]]] = {}
        for job_id, step in sorted({(label.job_id, label.step) for label in labels}):
            answers.update({f"{job_id}:{step}": await self._answers(job_id, step)})

        async def one(label: Any) -> Pair | None:
            found = answers[f"{label.job_id}:{label.step}"].get(label.position)
            if found is None:
                return None
            g = await self.judge_answer(tenant, row, *found)
            if g.score is None:
                return None
            return Pair(label.score, g.score, pass_fail=label.kind == "pass_fail")

        pairs = await asyncio.gather(*(one(label) for label in labels))
        kept = [p for p in pairs if p is not None]
        report = agreement(kept, pass_threshold=PASS_THRESHOLD / SCALE[1])
        return Calibration(report, version, self.model, unjudged=len(labels) - len(kept))

    async def reasked(self, job: EvalJobRow, step: int) -> dict[int, float]:
        """A point's answers that ended as judge_error, asked again under the current rubric
        (a judge_error is never kept as a verdict: the endpoint may be back): the scores of
        those that now have a verdict, by position."""
        rows = await asyncio.to_thread(records.results, self.db, job.job_id, step)
        failed = [r.position for _, r in rows if b'"judge_error"' in r.detail]
        rubric = await asyncio.to_thread(
            judge_records.latest_rubric, self.db, job.tenant, job.dataset_version
        )
        if not failed or rubric is None or self.client is None:
            return {}
        answers = await self._answers(job.job_id, step)
        grades = await asyncio.gather(
            *(self.judge_answer(job.tenant, rubric, *answers[p]) for p in failed if p in answers)
        )
        found = zip((p for p in failed if p in answers), grades, strict=True)
        return {p: g.score for p, g in found if g.score is not None}

    async def _answers(self, job_id: str, step: int) -> dict[int, tuple[EvalItem, Answer]]:
        items = {i.position: i for i in await asyncio.to_thread(records.items, self.db, job_id)}
        out = {}
        for _, result in await asyncio.to_thread(records.results, self.db, job_id, step):
            if result.position in items and not (result.error or "").startswith("engine"):
                calls = tuple((n, a) for n, a in json.loads(result.tool_calls))
                out[result.position] = (items[result.position], Answer(result.output, calls))
        return out

    # --- the decision -----------------------------------------------------------------------

    async def choose(self, job: EvalJobRow, scores: dict[int, float]) -> Choice | None:
        """Who chooses a judged job's checkpoint, before the top ones are re-scored: the judge
        while it is trusted and gave a verdict at every point of `scores` (its means), else the
        deterministic grader, on its scores of the same answers. None: the job is not judged."""
        judged = await asyncio.to_thread(judge_records.judged_job, self.db, job.job_id)
        if judged is None or not scores:
            return None
        steps = sorted(scores)
        points = await self.points(job.job_id, [BASE_STEP, *steps])
        calibration = await self.calibration(job.tenant, job.dataset_version)
        status, why = calibration.agreement.status, calibration.agreement.reason
        missing = [s for s in steps if s not in points or points[s].judge_score is None]
        if status == "trusted" and not missing:
            note = (
                f"The judge ({judged.model}, rubric {calibration.rubric_version}) is trusted: "
                f"{why}; the checkpoint was chosen by its scores{_unjudged(points, steps)}."
            )
            return Choice(True, note, dict(scores), job.base_score)
        if missing:
            why = "the judge gave no verdict at step(s) " + ", ".join(map(str, missing))
        else:
            why = f"the judge's calibration is '{status}' ({why})"
        grader = deterministic_grader(job.task_kind)
        note = f"Checkpoint choice fell back to the deterministic {grader} scores: {why}."
        fallen = {s: points[s].deterministic_score for s in steps if s in points}
        base = points[BASE_STEP].deterministic_score if BASE_STEP in points else None
        return Choice(False, note, fallen, base)

    def settle(self, made: decision.Decision, choice: Choice) -> decision.Decision:
        """The decision made on `choice`'s scores, in its words: gated on the judge's scale
        when the judge chose, else as the deterministic grader's decision (judge_fallback)."""
        if made.best_score is None:
            return made  # nothing was scored: the reason stands as it is
        if choice.by_judge:
            outcome, reason = judge_gate(made.best_score, made.base_score)
            whole = " (whole eval split)" if made.rescored else ""
            text = f"{choice.note} {reason}{whole}"
            return dataclasses.replace(made, gate=outcome, gate_reason=text)
        text = f"{choice.note} {made.gate_reason}"
        return dataclasses.replace(made, gate_reason=text, judge_fallback=True)


@dataclass(frozen=True)
class Choice:
    """Who chooses a judged job's checkpoint, and on which scores: `by_judge` (its means), or
    the deterministic grader's scores of the same answers; `note` begins the decision's text."""

    by_judge: bool
    note: str
    scores: dict[int, float]
    base_score: float | None


def deterministic_grader(task_kind: str) -> str:
    """The deterministic grader's name in the decision's words, e.g. `ROUGE-L`."""
    return DETERMINISTIC.get(task_kind, "deterministic")
