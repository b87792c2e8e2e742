"""Runs in the background: queued -> in_progress -> completed (or failed, or canceled by the
API), a chunk of items at a time — answered by the model when the run is `completions`, graded,
then stored with the run's counts in one transaction, so a poll sees progress and a cancel
takes effect at the next chunk (the task is also cancelled at once).

The caller's key lives in this process's memory for as long as its run does and is never
stored. After a restart a run is picked up again where it was: a `jsonl` run with deterministic
graders needs no key; a run that calls a model (a `completions` run's answers, a judge's grades)
goes on with an internal key of its tenant minted for it (resume.py), while the key that
started it is still valid; the items already graded stay as they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai
from pydantic import TypeAdapter
from sqlalchemy.engine import Engine

from services.evaluator import judge, templating
from services.evaluator.evals import generation, graders, model_graders, protocol, resume, store
from services.evaluator.models import EvalsOutputItemRow, EvalsRunRow

log = logging.getLogger("tuneloop.evaluator")
_CRITERIA = TypeAdapter(list[protocol.Criterion])
_SOURCE = TypeAdapter(protocol.DataSource)
Criterion = graders.TextGrader | model_graders.ModelGrader


@dataclass(frozen=True)
class Plan:
    criteria: list[Criterion]
    completions: protocol.CompletionsDataSource | None

    @property
    def judged(self) -> bool:
        return any(isinstance(c, model_graders.ModelGrader) for c in self.criteria)

    @property
    def calls_models(self) -> bool:
        """Whether the run needs a key: a model answers, or a judge grades."""
        return self.completions is not None or self.judged


def plan_of(engine: Engine, run: EvalsRunRow) -> Plan:
    eval_row = store.get_eval(engine, run.tenant, run.eval_id)
    if eval_row is None:
        raise generation.RunFailed("eval_deleted", f"eval {run.eval_id} no longer exists")
    criteria: list[Criterion] = []
    for index, c in enumerate(_CRITERIA.validate_python(store.loads(eval_row.testing_criteria))):
        if isinstance(c, protocol.ScoreModel | protocol.LabelModel):
            criteria.append(model_graders.to_grader(c, f"testing_criteria[{index}]"))
        elif isinstance(c, protocol.StringCheck | protocol.TextSimilarity):
            criteria.append(c)
    source = _SOURCE.validate_python(store.loads(run.data_source))
    completions = source if isinstance(source, protocol.CompletionsDataSource) else None
    return Plan(criteria, completions)


@dataclass(frozen=True)
class Pending:
    """An item about to be graded: its row, item, sample and what the deterministic graders
    said (None in the places of the judge's criteria, or for every criterion of an item the
    model did not answer: `unanswered` says why)."""

    row: EvalsOutputItemRow
    item: dict[str, Any]
    sample: dict[str, Any] | None
    results: list[dict[str, Any] | None]
    unanswered: str | None = None


def grade_text(
    criteria: list[Criterion], rows: list[EvalsOutputItemRow], answers: dict[int, dict[str, Any]]
) -> list[Pending]:
    """The deterministic grades of a chunk (CPU work: run in a thread). `answers`: the samples
    generated just now."""
    pending = []
    for row in rows:
        generated = answers.get(row.position)
        sample = generated if generated is not None else store.loads(row.sample)
        item = store.loads(row.item)
        error = (sample or {}).get("error")
        if error:
            reason = f"no answer to grade: {error.get('message', '')}"
            pending.append(Pending(row, item, sample, [None] * len(criteria), reason))
            continue
        context: dict[str, Any] = {"item": item}
        if sample is not None:
            context["sample"] = templating.sample_context(sample)
        results = [
            graders.grade_text(c, context) if isinstance(c, graders.TextGrader) else None
            for c in criteria
        ]
        pending.append(Pending(row, item, sample, results))
    return pending


class RunExecutor:
    """One task per live run, `runs_at_once` of them working; the rest wait their turn."""

    def __init__(
        self,
        engine: Engine,
        *,
        gateway_url: str,
        concurrency: int,
        runs_at_once: int,
        timeout_s: float,
        client_factory: Callable[[str, str], openai.AsyncOpenAI] | None = None,
        judge_factory: Callable[[str], judge.JudgeClient] | None = None,
    ) -> None:
        self.engine = engine
        self.gateway_url = gateway_url.rstrip("/")
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self.chunk = max(32, concurrency * 4)
        self._slots = asyncio.Semaphore(runs_at_once)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._client_factory = client_factory or self._client
        self._judge_factory = judge_factory or self._judge

    def _client(self, key: str, run_id: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.gateway_url}/v1",
            api_key=key,
            timeout=self.timeout_s,
            max_retries=2,
            default_headers={generation.TAGS_HEADER: f"eval_run:{run_id}"},
        )

    async def start(self) -> None:
        """Pick up the runs a previous process left queued or in progress: those that call a
        model with a key minted for each (resume.py), once the keys a previous process minted
        are revoked; a run whose caller's key was revoked fails `unauthorized`."""
        await asyncio.to_thread(resume.sweep, self.engine)
        for run in await asyncio.to_thread(store.live_runs, self.engine):
            try:
                plan = await asyncio.to_thread(plan_of, self.engine, run)
            except generation.RunFailed:
                plan = None  # its eval is gone: the run's task says so
            if plan is None or not plan.calls_models:
                self.submit(run.id, None)
                continue
            try:
                key = await asyncio.to_thread(resume.mint, self.engine, run)
            except resume.CallerGone as exc:
                why = f"the evaluator restarted during this run and {exc}: it does not go on"
                await self._finish(run.id, "failed", ("unauthorized", why), only_from=store.LIVE)
                continue
            self.submit(run.id, key, minted=True)

    async def stop(self) -> None:
        """Stop the tasks; their runs stay live in the database for the next process."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def submit(self, run_id: str, key: str | None, *, minted: bool = False) -> None:
        """Work the run in a task of its own; `minted`: `key` is the run's own (resume.py),
        revoked when the task ends."""
        if run_id not in self._tasks:
            work = self._execute(run_id, key, minted=minted)
            task = asyncio.create_task(work, name=f"eval-run-{run_id}")
            self._tasks[run_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(run_id, None))

    async def cancel(self, run_id: str) -> None:
        """Stop the run's task (its status was set by the caller)."""
        task = self._tasks.get(run_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def wait(self, run_id: str) -> None:
        task = self._tasks.get(run_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _execute(self, run_id: str, key: str | None, *, minted: bool) -> None:
        try:
            async with self._slots:
                await self._run(run_id, key)
        finally:
            if minted:  # the run's own key ends with its task, however it ends
                await asyncio.shield(asyncio.to_thread(resume.revoke, self.engine, run_id))

    async def _run(self, run_id: str, key: str | None) -> None:
        run = await asyncio.to_thread(store.set_status, self.engine, run_id, "in_progress")
        if run is None:
            return  # canceled or deleted while it waited
        try:
            await self._work(run, key)
        except generation.RunFailed as exc:
            await self._finish(run_id, "failed", (exc.code, str(exc)))
        except Exception as exc:
            log.exception("eval run %s failed", run_id)
            await self._finish(run_id, "failed", ("internal_error", f"{type(exc).__name__}: {exc}"))

    async def _finish(
        self,
        run_id: str,
        status: str,
        error: tuple[str, str] | None,
        only_from: tuple[str, ...] = ("in_progress",),
    ) -> None:
        await asyncio.to_thread(
            store.set_status, self.engine, run_id, status, only_from=only_from, error=error
        )

    async def _work(self, run: EvalsRunRow, key: str | None) -> None:
        plan = await asyncio.to_thread(plan_of, self.engine, run)
        if key is None and plan.calls_models:  # resume.py mints one for every such run
            raise generation.RunFailed("interrupted", "no API key to call the model with")
        async with contextlib.AsyncExitStack() as stack:
            client, judge_client = None, None
            if key is not None and plan.completions is not None:
                client = self._client_factory(key, run.id)
                stack.push_async_callback(client.close)
            if key is not None and plan.judged:
                judge_client = self._judge_factory(key)
                stack.push_async_callback(judge_client.aclose)
            while await self._chunk(run, plan, client, judge_client):
                pass
        await self._finish(run.id, "completed", None)

    async def _chunk(
        self,
        run: EvalsRunRow,
        plan: Plan,
        client: openai.AsyncOpenAI | None,
        judge_client: judge.JudgeClient | None,
    ) -> bool:
        """Answer, grade and store the next chunk; False when none is left or the run was
        canceled meanwhile."""
        rows = await asyncio.to_thread(store.pending_items, self.engine, run.id, self.chunk)
        if not rows:
            return False
        answers, usage = await self._answers(client, plan.completions, rows)
        pending = await asyncio.to_thread(grade_text, plan.criteria, rows, answers)
        done = await asyncio.gather(
            *(_results(entry, plan.criteria, judge_client, run.tenant) for entry in pending)
        )
        return await asyncio.to_thread(store.store_graded, self.engine, run.id, done, usage)

    def _judge(self, key: str) -> judge.JudgeClient:
        return model_graders.client(
            f"{self.gateway_url}/v1", key, self.engine,
            concurrency=self.concurrency, timeout_s=self.timeout_s,
        )  # fmt: skip

    async def _answers(
        self,
        client: openai.AsyncOpenAI | None,
        completions: protocol.CompletionsDataSource | None,
        rows: list[EvalsOutputItemRow],
    ) -> tuple[dict[int, dict[str, Any]], dict[str, dict[str, int]]]:
        """Samples for the rows that have none yet, `concurrency` calls in flight, and the
        tokens they used."""
        needed = [row for row in rows if row.sample is None]
        if client is None or completions is None or not needed:
            return {}, {}
        assert completions.model is not None  # serving.py refuses a run without them
        assert completions.input_messages is not None
        model, messages = completions.model, completions.input_messages
        params = completions.sampling_params or protocol.SamplingParams()
        gate = asyncio.Semaphore(self.concurrency)

        async def one(row: EvalsOutputItemRow) -> generation.Answer:
            async with gate:
                return await generation.answer(
                    client, model=model, messages=messages, params=params,
                    item=store.loads(row.item),
                )  # fmt: skip

        answers = await asyncio.gather(*(one(row) for row in needed))
        totals = {"invocation_count": 0, "prompt_tokens": 0, "completion_tokens": 0,
                  "total_tokens": 0, "cached_tokens": 0}  # fmt: skip
        for found in answers:
            totals["invocation_count"] += found.called
            for name, value in (found.usage or {}).items():
                totals[name] += value
        samples = {row.position: found.sample for row, found in zip(needed, answers, strict=True)}
        return samples, {model: totals}


async def _results(
    entry: Pending, criteria: list[Criterion], judge_client: judge.JudgeClient | None, tenant: str
) -> store.Done:
    """An item's results in the criteria's order, the judge's filled in."""
    results: list[dict[str, Any]] = []
    for criterion, found in zip(criteria, entry.results, strict=True):
        if entry.unanswered is not None:
            kind = (graders.RESULT_TYPES | model_graders.RESULT_TYPES)[criterion.type]
            found = graders.result(criterion.name, kind, 0.0, False, error=entry.unanswered)
        elif found is None:
            assert judge_client is not None  # a key is there, or _work stopped before
            assert isinstance(criterion, model_graders.ModelGrader)
            sample = templating.sample_context(entry.sample or {})
            found = await model_graders.grade(
                judge_client, criterion, tenant=tenant, item=entry.item, sample=sample
            )
        results.append(found)
    generated = entry.sample if entry.row.sample is None else None
    return store.Done(entry.row.position, graders.status_of(results), results, generated)
