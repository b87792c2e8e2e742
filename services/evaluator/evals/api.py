"""HTTP routes of the Evals API, as OpenAI's (`client.evals...` of the `openai` SDK, through the
gateway, which relays /v1/evals here with the caller's key). HTTP only: the work is serving.py's,
and errors become OpenAI's error body in one place (`add_error_handlers`).

`GET /v1/evals/{eval_id}` is served by services/evaluator/api.py, whose `/v1/evals/{job_id}`
shares the path: an `eval_...` id is an eval of this API, any other a job's evaluation.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from services.evaluator.evals import compare, protocol
from services.evaluator.evals.errors import EvalsError
from services.evaluator.evals.serving import Evals
from shared import auth
from shared.service import validation_error

router = APIRouter(prefix="/v1", tags=["evals"], dependencies=[Depends(auth.require_access)])
Principal = Annotated[auth.Principal, Depends(auth.require_access)]
Limit = Annotated[int, Query(ge=1, le=100, description="how many to return")]
After = Annotated[str | None, Query(description="the id of the last object of the page before")]
Order = Annotated[Literal["asc", "desc"], Query(description="by creation time")]


def get_evals(request: Request) -> Evals:
    evals: Evals = request.app.state.evals
    return evals


EvalsDep = Annotated[Evals, Depends(get_evals)]


@router.post("/evals", response_model=protocol.Eval, summary="Create an eval")
async def create_eval(
    body: protocol.EvalCreate, principal: Principal, evals: EvalsDep
) -> protocol.Eval:
    return await evals.create_eval(principal.tenant_id, body)


@router.get("/evals", response_model=protocol.EvalList, summary="The tenant's evals")
async def list_evals(
    principal: Principal,
    evals: EvalsDep,
    after: After = None,
    limit: Limit = 20,
    order: Order = "asc",
    order_by: Literal["created_at", "updated_at"] = "created_at",
) -> protocol.EvalList:
    return await evals.list_evals(
        principal.tenant_id, after=after, limit=limit, order=order, order_by=order_by
    )


@router.post("/evals/{eval_id}", response_model=protocol.Eval, summary="Rename an eval, or "
             "replace its metadata")  # fmt: skip
async def update_eval(
    eval_id: str, body: protocol.EvalUpdate, principal: Principal, evals: EvalsDep
) -> protocol.Eval:
    return await evals.update_eval(principal.tenant_id, eval_id, body)


@router.delete("/evals/{eval_id}", response_model=protocol.EvalDeleted,
               summary="Delete an eval with its runs (live ones are canceled)")  # fmt: skip
async def delete_eval(eval_id: str, principal: Principal, evals: EvalsDep) -> protocol.EvalDeleted:
    return await evals.delete_eval(principal.tenant_id, eval_id)


@router.post("/evals/{eval_id}/runs", response_model=protocol.Run,
             summary="Start a run: its items are checked now, answered and graded in the "
             "background")  # fmt: skip
async def create_run(
    eval_id: str, body: protocol.RunCreate, request: Request, principal: Principal, evals: EvalsDep
) -> protocol.Run:
    key = auth.presented_key(request)
    return await evals.create_run(
        principal.tenant_id, eval_id, body, key=key, key_id=principal.key_id
    )


@router.get("/evals/{eval_id}/runs", response_model=protocol.RunList, summary="An eval's runs")
async def list_runs(
    eval_id: str,
    principal: Principal,
    evals: EvalsDep,
    after: After = None,
    limit: Limit = 20,
    order: Order = "asc",
    status: protocol.RunStatus | None = None,
) -> protocol.RunList:
    return await evals.list_runs(
        principal.tenant_id, eval_id, after=after, limit=limit, order=order, status=status
    )


@router.get("/evals/{eval_id}/runs/{run_id}", response_model=protocol.Run,
            summary="A run: status, result counts, per-criterion results, usage")  # fmt: skip
async def get_run(eval_id: str, run_id: str, principal: Principal, evals: EvalsDep) -> protocol.Run:
    return await evals.get_run(principal.tenant_id, eval_id, run_id)


@router.post("/evals/{eval_id}/runs/{run_id}/cancel", response_model=protocol.Run,
             summary="Cancel a queued or in-progress run")  # fmt: skip
async def cancel_run(
    eval_id: str, run_id: str, principal: Principal, evals: EvalsDep
) -> protocol.Run:
    return await evals.cancel_run(principal.tenant_id, eval_id, run_id)


@router.delete("/evals/{eval_id}/runs/{run_id}", response_model=protocol.RunDeleted,
               summary="Delete a run and its output items")  # fmt: skip
async def delete_run(
    eval_id: str, run_id: str, principal: Principal, evals: EvalsDep
) -> protocol.RunDeleted:
    return await evals.delete_run(principal.tenant_id, eval_id, run_id)


@router.get("/evals/{eval_id}/runs/{run_id}/output_items", response_model=protocol.OutputItemList,
            summary="A run's graded items, each with its sample and per-criterion results")  # fmt: skip
async def list_output_items(
    eval_id: str,
    run_id: str,
    principal: Principal,
    evals: EvalsDep,
    after: After = None,
    limit: Limit = 20,
    order: Order = "asc",
    status: Literal["pass", "fail", "error"] | None = None,
) -> protocol.OutputItemList:
    return await evals.list_items(
        principal.tenant_id, eval_id, run_id, after=after, limit=limit, order=order, status=status
    )


@router.get("/evals/{eval_id}/runs/{run_id}/output_items/{output_item_id}",
            response_model=protocol.OutputItem, summary="One graded item of a run")  # fmt: skip
async def get_output_item(
    eval_id: str, run_id: str, output_item_id: str, principal: Principal, evals: EvalsDep
) -> protocol.OutputItem:
    return await evals.get_item(principal.tenant_id, eval_id, run_id, output_item_id)


AFTER_ITEM = "datasource_item_id of the last item of the page before"


@router.get("/evals/{eval_id}/compare", response_model=compare.Comparison,
            summary="Two completed runs over the same items side by side: score and latency "
            "per item, the candidate's regressions first")  # fmt: skip
async def compare_runs(
    eval_id: str,
    principal: Principal,
    evals: EvalsDep,
    base: Annotated[str, Query(min_length=1, description="the run compared against")],
    candidate: Annotated[str, Query(min_length=1, description="the run whose changes are listed")],
    after: Annotated[int | None, Query(ge=0, description=AFTER_ITEM)] = None,
    limit: Limit = 20,
) -> compare.Comparison:
    return await compare.compare(
        evals.engine, principal.tenant_id, eval_id,
        base=base, candidate=candidate, after=after, limit=limit,
    )  # fmt: skip


# --- errors, in OpenAI's shape (the SDK's exception then carries the message) ----------------


def openai_error(status: int, message: str, param: str | None, code: str) -> dict[str, Any]:
    """OpenAI's error body, with our usual `detail` beside it."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code},
            "detail": message}  # fmt: skip


async def _evals_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EvalsError)
    return JSONResponse(openai_error(exc.status, str(exc), exc.param, exc.code), exc.status)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 as the service answers it (`detail`: the field errors), plus `error`
    naming the first field."""
    assert isinstance(exc, RequestValidationError)
    answer = await validation_error(request, exc)
    body = json.loads(bytes(answer.body))
    fields = [".".join(str(p) for p in e["loc"] if p != "body") or "body" for e in exc.errors()]
    message = "; ".join(f"{f}: {e['msg']}" for f, e in zip(fields, exc.errors(), strict=True))
    body["error"] = openai_error(422, message, fields[0] if fields else None, "invalid_value")[
        "error"
    ]
    return JSONResponse(body, 422)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    """A key refused (401, 403) or a route not found, in OpenAI's shape too."""
    assert isinstance(exc, HTTPException)
    codes = {401: "invalid_api_key", 403: "insufficient_scope", 404: "not_found"}
    body = openai_error(exc.status_code, str(exc.detail), None, codes.get(exc.status_code, ""))
    return JSONResponse(body, exc.status_code, headers=exc.headers)


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(EvalsError, _evals_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
