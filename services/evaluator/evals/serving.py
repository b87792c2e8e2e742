"""The work behind the Evals API's routes: check a definition, store it, start and stop runs,
and lay rows out as OpenAI's objects. Every call is for one tenant; what is not the tenant's is
a 404, as if it did not exist."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, cast

import httpx
from sqlalchemy.engine import Engine

from services.evaluator.config import EvaluatorSettings
from services.evaluator.evals import checks, protocol, sources, store
from services.evaluator.evals.errors import EvalsError, not_found, unsupported
from services.evaluator.evals.runs import RunExecutor
from services.evaluator.models import EvalsEvalRow, EvalsOutputItemRow, EvalsRunRow
from shared.settings import Settings

EVAL_PREFIX, RUN_PREFIX, ITEM_PREFIX = "eval_", "evalrun_", "outputitem_"
T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
ListT = TypeVar("ListT", protocol.EvalList, protocol.RunList, protocol.OutputItemList)
ItemStatus = Literal["pass", "fail", "error"]
# What a `completions` run puts in the `sample` namespace (OpenAI's names).
SAMPLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "model": {"type": "string"},
        "output_text": {"type": "string"},
        "output_json": {"type": "object"},
        "output_tools": {"type": "array", "items": {"type": "object"}},
    },
    "required": ["model", "output_text"],
}


def is_eval_id(ident: str) -> bool:
    return ident.startswith(EVAL_PREFIX)


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def _seconds(row: Any, name: str = "created_at") -> int:
    return int(getattr(row, name).timestamp())


def _found(value: T | None, kind: str, ident: str, param: str) -> T:
    """`value`, or the 404 naming `param` when there is none (or it is another tenant's)."""
    if value is None:
        raise not_found(kind, ident, param)
    return value


def _listed(
    shape: type[ListT],
    page: store.Page[R] | None,
    to_object: Callable[[R], Any],
    kind: str,
    after: str | None,
) -> ListT:
    """A page of rows in OpenAI's list shape (its objects, the first and last ids, whether more
    follow); the 404 naming `after` when the store found no such `kind` to page after."""
    found = _found(page, kind, str(after), "after")
    data = [to_object(row) for row in found.rows]
    return shape(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=found.has_more,
    )


def eval_object(row: EvalsEvalRow) -> protocol.Eval:
    config = store.loads(row.data_source_config)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"item": config["item_schema"]},
        "required": ["item"],
    }
    if config["include_sample_schema"]:
        schema["properties"]["sample"] = SAMPLE_SCHEMA
        schema["required"].append("sample")
    return protocol.Eval(
        id=row.id,
        created_at=_seconds(row),
        name=row.name,
        metadata=store.loads(row.meta),
        data_source_config={"type": "custom", "schema": schema},
        testing_criteria=store.loads(row.testing_criteria),
    )


def eval_by_id(engine: Engine, tenant: str, eval_id: str) -> protocol.Eval:
    """The tenant's eval (blocking); 404 naming `eval_id` for any other."""
    return eval_object(_found(store.get_eval(engine, tenant, eval_id), "eval", eval_id, "eval_id"))


class Evals:
    """The Evals API's operations for the routes in api.py."""

    def __init__(
        self,
        engine: Engine,
        executor: RunExecutor,
        reader: sources.IngestReader,
        *,
        max_items: int,
    ) -> None:
        self.engine, self.executor, self.reader = engine, executor, reader
        self.max_items = max_items

    @classmethod
    def from_settings(cls, engine: Engine, config: EvaluatorSettings, settings: Settings) -> Evals:
        """The service as configured: runs call the gateway (ingest), which also serves the
        uploaded files and datasets they read."""
        ingest = config.ingest(settings)
        executor = RunExecutor(
            engine,
            gateway_url=ingest,
            concurrency=config.evals_concurrency,
            runs_at_once=config.evals_runs_at_once,
            timeout_s=config.evals_request_timeout_s,
        )
        http = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0))
        reader = sources.IngestReader(http, ingest, max_bytes=config.evals_max_file_bytes)
        return cls(engine, executor, reader, max_items=config.evals_max_items)

    async def start(self) -> None:
        await self.executor.start()

    async def stop(self) -> None:
        await self.executor.stop()
        await self.reader.client.aclose()

    async def _db(
        self, work: Callable[Concatenate[Engine, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """A store function on this service's database, in a thread (it blocks)."""
        return await asyncio.to_thread(work, self.engine, *args, **kwargs)

    # --- evals --------------------------------------------------------------------------------

    async def _eval_row(self, tenant: str, eval_id: str) -> EvalsEvalRow:
        row = await self._db(store.get_eval, tenant, eval_id)
        return _found(row, "eval", eval_id, "eval_id")

    async def create_eval(self, tenant: str, body: protocol.EvalCreate) -> protocol.Eval:
        config = checks.check_eval(body)
        ident = _new_id(EVAL_PREFIX)
        row = EvalsEvalRow(
            id=ident,
            tenant=tenant,
            name=body.name or ident,
            meta=store.dumps(body.metadata),
            data_source_config=store.dumps(config.model_dump(exclude={"type"})),
            testing_criteria=store.dumps(
                [c.model_dump(mode="json", exclude_none=True) for c in body.testing_criteria]
            ),
        )
        await self._db(store.add, row)
        return eval_object(row)

    async def get_eval(self, tenant: str, eval_id: str) -> protocol.Eval:
        return await self._db(eval_by_id, tenant, eval_id)

    async def list_evals(
        self, tenant: str, *, after: str | None, limit: int, order: store.Order, order_by: str
    ) -> protocol.EvalList:
        page = await self._db(
            store.list_evals, tenant, after=after, limit=limit, order=order, order_by=order_by
        )
        return _listed(protocol.EvalList, page, eval_object, "eval", after)

    async def update_eval(
        self, tenant: str, eval_id: str, body: protocol.EvalUpdate
    ) -> protocol.Eval:
        meta = store.dumps(body.metadata) if "metadata" in body.model_fields_set else None
        row = await self._db(store.update_eval, tenant, eval_id, name=body.name, meta=meta)
        return eval_object(_found(row, "eval", eval_id, "eval_id"))

    async def delete_eval(self, tenant: str, eval_id: str) -> protocol.EvalDeleted:
        live = await self._db(store.delete_eval, tenant, eval_id)
        for run_id in _found(live, "eval", eval_id, "eval_id"):
            await self.executor.cancel(run_id)
        return protocol.EvalDeleted(deleted=True, eval_id=eval_id)

    # --- runs ---------------------------------------------------------------------------------

    async def _rows(
        self, body: protocol.RunCreate, headers: dict[str, str]
    ) -> tuple[sources.Read, str, str]:
        """The run's items (and the source's id as the run records it), the field that names
        them and the label of one in messages."""
        source = body.data_source
        if isinstance(source, protocol.OtherDataSource):
            raise unsupported("data_source.type", f"a {source.type!r} data source")
        given = source.source
        if isinstance(given, protocol.OtherSource):
            raise unsupported("data_source.source.type", f"a {given.type!r} source")
        if isinstance(given, protocol.FileContent):
            rows = [sources.Row(row.item, row.sample) for row in given.content]
            read = sources.Read(rows, "")
            return read, "data_source.source.content", "data_source.source.content"
        read = await self.reader.read(given.id, headers)
        return read, sources.SOURCE_ID, f"{given.id} item"

    async def create_run(
        self,
        tenant: str,
        eval_id: str,
        body: protocol.RunCreate,
        *,
        key: str | None,
        key_id: str | None = None,
    ) -> protocol.Run:
        """Check and store the run and start it in the background. `key` (kept in memory while
        a model is to be called with it) and `key_id`, its id, stored: after a restart the run
        goes on only while that key is valid (resume.py)."""
        eval_row = await self._eval_row(tenant, eval_id)
        source = body.data_source
        checks.check_writable(source.model_dump(mode="json"), "data_source")
        completions = source if isinstance(source, protocol.CompletionsDataSource) else None
        if completions is not None:
            config = store.loads(eval_row.data_source_config)
            checks.check_messages(completions, checks.item_properties(config["item_schema"]))
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        read, param, label = await self._rows(body, headers)
        rows = read.rows
        checks.check_rows(rows, eval_row, body, param=param, label=label, max_items=self.max_items)
        run_id = _new_id(RUN_PREFIX)
        given = completions is None  # a jsonl run's samples are given, a completions run's made
        recorded = source.model_dump(mode="json", exclude_none=True)
        if read.source_id:  # an eval set's latest is recorded as the version it was
            recorded["source"]["id"] = read.source_id
        run = EvalsRunRow(
            id=run_id,
            eval_id=eval_id,
            tenant=tenant,
            name=body.name or run_id,
            meta=store.dumps(body.metadata),
            data_source=store.dumps(recorded),
            model=completions.model if completions is not None else None,
            status="queued",
            items=len(rows),
            per_criteria=store.dumps(
                {c["name"]: [0, 0] for c in store.loads(eval_row.testing_criteria)}
            ),
            usage=store.dumps({}),
            caller_key_id=key_id,
        )
        items = [
            EvalsOutputItemRow(
                run_id=run_id,
                position=position,
                id=_new_id(ITEM_PREFIX),
                item=store.dumps(row.item),
                sample=store.dumps(row.sample) if given and row.sample is not None else None,
                status="pending",
            )
            for position, row in enumerate(rows)
        ]
        await self._db(store.add, run, *items)
        # The caller's key is kept (in memory) only while a model is to be called with it.
        needs_key = completions is not None or checks.judged(store.loads(eval_row.testing_criteria))
        self.executor.submit(run_id, key if needs_key else None)
        return run_object(run)

    async def _run_row(self, tenant: str, eval_id: str, run_id: str) -> EvalsRunRow:
        row = await self._db(store.get_run, tenant, eval_id, run_id)
        return _found(row, "run", run_id, "run_id")

    async def _stop(self, run_id: str) -> EvalsRunRow | None:
        """Cancel a live run: its status first (a conditional update: the runner never
        overwrites it), then its task. The row canceled, or None when it was live no more."""
        canceled = await self._db(store.set_status, run_id, "canceled")
        await self.executor.cancel(run_id)
        return canceled

    async def get_run(self, tenant: str, eval_id: str, run_id: str) -> protocol.Run:
        return run_object(await self._run_row(tenant, eval_id, run_id))

    async def list_runs(
        self, tenant: str, eval_id: str, *, after: str | None, limit: int,
        order: store.Order, status: str | None,
    ) -> protocol.RunList:  # fmt: skip
        await self._eval_row(tenant, eval_id)
        page = await self._db(
            store.list_runs, eval_id, after=after, limit=limit, order=order, status=status
        )
        return _listed(protocol.RunList, page, run_object, "run", after)

    async def cancel_run(self, tenant: str, eval_id: str, run_id: str) -> protocol.Run:
        row = await self._run_row(tenant, eval_id, run_id)
        if row.status in store.LIVE:
            row = await self._stop(run_id) or await self._run_row(tenant, eval_id, run_id)
        if row.status != "canceled":
            raise EvalsError(
                409, f"run_id: run {run_id} is {row.status}; only a queued or in-progress run "
                "can be canceled", param="run_id", code="conflict",
            )  # fmt: skip
        return run_object(row)

    async def delete_run(self, tenant: str, eval_id: str, run_id: str) -> protocol.RunDeleted:
        row = await self._run_row(tenant, eval_id, run_id)
        if row.status in store.LIVE:
            await self._stop(run_id)
        await self._db(store.delete_run, tenant, eval_id, run_id)
        return protocol.RunDeleted(deleted=True, run_id=run_id)

    # --- output items -------------------------------------------------------------------------

    async def list_items(
        self, tenant: str, eval_id: str, run_id: str, *, after: str | None, limit: int,
        order: store.Order, status: str | None,
    ) -> protocol.OutputItemList:  # fmt: skip
        await self._run_row(tenant, eval_id, run_id)
        page = await self._db(
            store.list_items, run_id, after=after, limit=limit, order=order, status=status
        )
        to_object = functools.partial(item_object, eval_id=eval_id)
        return _listed(protocol.OutputItemList, page, to_object, "output item", after)

    async def get_item(
        self, tenant: str, eval_id: str, run_id: str, item_id: str
    ) -> protocol.OutputItem:
        await self._run_row(tenant, eval_id, run_id)
        row = await self._db(store.get_item, run_id, item_id)
        return item_object(_found(row, "output item", item_id, "output_item_id"), eval_id)


def run_object(row: EvalsRunRow) -> protocol.Run:
    per_criteria: dict[str, list[int]] = store.loads(row.per_criteria) or {}
    usage: dict[str, dict[str, int]] = store.loads(row.usage) or {}
    return protocol.Run(
        id=row.id,
        eval_id=row.eval_id,
        created_at=_seconds(row),
        name=row.name,
        metadata=store.loads(row.meta),
        model=row.model,
        status=cast(protocol.RunStatus, row.status),
        data_source=store.loads(row.data_source),
        error=protocol.ApiError(code=row.error_code, message=row.error_message or "")
        if row.error_code
        else None,
        result_counts=protocol.ResultCounts(
            total=row.passed + row.failed + row.errored,
            passed=row.passed,
            failed=row.failed,
            errored=row.errored,
        ),
        per_testing_criteria_results=[
            protocol.CriterionResult(testing_criteria=name, passed=counts[0], failed=counts[1])
            for name, counts in per_criteria.items()
        ],
        per_model_usage=[
            protocol.ModelUsage(model_name=model, **numbers) for model, numbers in usage.items()
        ],
        report_url=None,
        judge_errors=row.judge_errors,
    )


def item_object(row: EvalsOutputItemRow, eval_id: str) -> protocol.OutputItem:
    graded = row.graded_at
    return protocol.OutputItem(
        id=row.id,
        created_at=int(graded.timestamp()) if graded else 0,
        run_id=row.run_id,
        eval_id=eval_id,
        status=cast(ItemStatus, row.status),  # graded: pass, fail or error
        datasource_item_id=row.position,
        datasource_item=store.loads(row.item),
        results=[protocol.GraderResult(**result) for result in store.loads(row.results) or []],
        sample=store.loads(row.sample),
    )
