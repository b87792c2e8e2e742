"""The dashboard's routes under /ui: sign-in and sign-out, the pages (datasets, jobs, a job's
evaluation, run comparison, models and deployments), the job page's progress poll, and the
buttons (deploy, rollback, promote). Left out of the OpenAPI document: they answer browsers."""

from __future__ import annotations

import asyncio
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from services.ingest.ui import data, series, views
from services.ingest.ui.data import Api, segment
from services.ingest.ui.sessions import (
    COOKIE,
    LIFETIME_S,
    SIGN_IN_COOKIE,
    SessionStore,
    SignedOut,
    UiError,
    UiSession,
    check_change,
    check_origin,
    check_token,
    clear_cookie,
    set_cookie,
)
from shared import auth, delegation
from shared.db import session_scope

router = APIRouter(prefix="/ui", include_in_schema=False)
Csrf = Annotated[str | None, Form()]


def _store(request: Request) -> SessionStore:
    store: SessionStore = request.app.state.ui_sessions
    return store


async def current_session(request: Request) -> UiSession:
    session = await _store(request).get(request.cookies.get(COOKIE, ""))
    if session is None:
        raise SignedOut()
    return session


SessionDep = Annotated[UiSession, Depends(current_session)]


def api(request: Request, session: UiSession, scope: delegation.DelegatedScope = "read") -> Api:
    token = request.app.state.runtime.settings.auth.service_token.get_secret_value()
    return Api(request.app, session, delegation.signing_key(token), scope)


def _see_other(url: str) -> Response:
    return views.secured(RedirectResponse(url, status_code=303))


async def error_page(request: Request, exc: Exception) -> Response:
    """Every UiError, mapped once: JSON for the job page's poll, the sign-in form for a missing
    or ended session, else the error page with the status."""
    assert isinstance(exc, UiError)
    if "application/json" in request.headers.get("accept", ""):
        return views.data({"detail": str(exc)}, exc.status)
    if isinstance(exc, SignedOut) and request.method == "GET":
        response = _see_other("/ui/sign-in")
        clear_cookie(request, response, COOKIE)
        return response
    context = {"status": exc.status, "message": str(exc), "session": None}
    return views.page(request, "error.html", context, exc.status)


# --- signing in and out --------------------------------------------------------------------------


@router.get("")
async def home() -> Response:
    return _see_other("/ui/jobs")


@router.get("/sign-in")
async def sign_in_form(request: Request) -> Response:
    if await _store(request).get(request.cookies.get(COOKIE, "")) is not None:
        return _see_other("/ui/jobs")
    return _sign_in_page(request, None, 200)


def _sign_in_page(request: Request, message: str | None, status: int) -> Response:
    token = secrets.token_urlsafe(32)
    context = {"csrf": token, "message": message, "session": None}
    response = views.page(request, "sign_in.html", context, status)
    set_cookie(request, response, SIGN_IN_COOKIE, token, max_age=3600)
    return response


@router.post("/sign-in")
async def sign_in(
    request: Request, key: Annotated[str, Form()] = "", csrf: Csrf = None
) -> Response:
    """The key is checked, and only its id, tenant and scope are kept (sessions.py). No length
    limit of the form's own: FastAPI's 422 would echo the field back; a key too long is malformed."""
    check_origin(request)
    check_token(csrf, request.cookies.get(SIGN_IN_COOKIE, ""))
    engine = request.app.state.db_engine
    try:
        principal = await asyncio.to_thread(_authenticate, engine, key.strip())
    except auth.AuthError as exc:  # its message never holds the key
        return _sign_in_page(request, str(exc), 401)
    prefix = auth.KEY_PATTERN.fullmatch(key.strip())
    token, _ = await _store(request).create(principal, prefix[1] if prefix else "")
    response = _see_other("/ui/jobs")
    set_cookie(request, response, COOKIE, token, max_age=LIFETIME_S)
    clear_cookie(request, response, SIGN_IN_COOKIE)
    return response


def _authenticate(engine: Any, key: str) -> auth.Principal:
    if not auth.KEY_PATTERN.fullmatch(key):  # a delegated credential signs no one in
        raise auth.MalformedKeyError("API key is malformed: tuneloop keys look like tl_…_…")
    with session_scope(engine) as session:
        return auth.authenticate(session, key)


@router.post("/sign-out")
async def sign_out(request: Request, session: SessionDep, csrf: Csrf = None) -> Response:
    check_origin(request)
    check_token(csrf, session.csrf)
    await _store(request).end(request.cookies.get(COOKIE, ""))
    response = _see_other("/ui/sign-in")
    clear_cookie(request, response, COOKIE)
    return response


# --- pages -------------------------------------------------------------------------------------


@router.get("/datasets")
async def datasets(request: Request, session: SessionDep) -> Response:
    found = await api(request, session).get("/datasets", limit=100)
    return views.page(request, "datasets.html", {"session": session, "datasets": found["data"]})


@router.get("/datasets/{dataset_id}")
async def dataset(request: Request, session: SessionDep, dataset_id: str) -> Response:
    found = await api(request, session).get(f"/datasets/{segment(dataset_id)}")
    return views.page(request, "dataset.html", {"session": session, "dataset": found})


@router.get("/jobs")
async def jobs(request: Request, session: SessionDep) -> Response:
    found = await api(request, session).get("/fine_tuning/jobs", limit=100)
    return views.page(request, "jobs.html", {"session": session, "jobs": found["data"]})


@router.get("/jobs/{job_id}")
async def job(request: Request, session: SessionDep, job_id: str) -> Response:
    client = api(request, session)
    found = await client.get(f"/fine_tuning/jobs/{segment(job_id)}")
    recent = await client.get(f"/fine_tuning/jobs/{segment(job_id)}/events", limit=100)
    messages = [e for e in recent["data"] if e.get("type") != "metrics"][:40]
    # The evaluator's record names the dataset the job trained on (the job names its file).
    evaluation = await client.found(f"/evals/{segment(job_id)}")
    context = {"session": session, "job": found, "messages": messages, "evaluation": evaluation}
    return views.page(request, "job.html", context)


@router.get("/jobs/{job_id}/progress")
async def job_progress(
    request: Request,
    session: SessionDep,
    job_id: str,
    since: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """What the job page's charts need, polled while the job runs: with `since` (the newest
    event the page has), only what came after it."""
    client = api(request, session)
    found = await client.get(f"/fine_tuning/jobs/{segment(job_id)}")
    events, complete = await data.job_events(client, job_id, since=since)
    return views.data(series.progress(found, events, complete=complete))


@router.get("/jobs/{job_id}/evaluation")
async def evaluation(
    request: Request,
    session: SessionDep,
    job_id: str,
    step: Annotated[str | None, Query(max_length=16)] = None,
) -> Response:
    """The job's evaluation, and each item at one point: input, output, score, assessment."""
    client = api(request, session)
    found = await client.found(f"/evals/{segment(job_id)}")
    shown = step or (series.default_step(found) if found else None)
    items = None
    if found is not None and shown is not None:
        items = await client.get(f"/evals/{segment(job_id)}/points/{segment(str(shown))}/items")
    context = {
        "session": session, "job_id": job_id, "evaluation": found, "step": shown, "items": items,
    }  # fmt: skip
    return views.page(request, "evaluation.html", context)


@router.get("/compare")
async def compare(
    request: Request,
    session: SessionDep,
    eval_id: Annotated[str | None, Query(max_length=64)] = None,
    base: Annotated[str | None, Query(max_length=64)] = None,
    candidate: Annotated[str | None, Query(max_length=64)] = None,
    after: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """Two runs of an eval side by side (the evaluator's compare route), picked from lists."""
    client = api(request, session)
    evals = (await client.get("/evals", limit=100))["data"]
    runs = (
        (await client.get(f"/evals/{segment(eval_id)}/runs", limit=100))["data"] if eval_id else []
    )
    comparison = None
    if eval_id and base and candidate:
        path = f"/evals/{segment(eval_id)}/compare"
        comparison = await client.get(path, base=base, candidate=candidate, after=after, limit=50)
    context = {
        "session": session, "evals": evals, "runs": runs, "eval_id": eval_id, "base": base,
        "candidate": candidate, "comparison": comparison,
    }  # fmt: skip
    return views.page(request, "compare.html", context)


@router.get("/models")
async def models(
    request: Request,
    session: SessionDep,
    deployed: Annotated[str | None, Query(max_length=64)] = None,
    done: Annotated[str | None, Query(max_length=16)] = None,
    name: Annotated[str | None, Query(max_length=128)] = None,
) -> Response:
    found = await data.models_page(api(request, session))
    notice = _notice(deployed, done, name)
    return views.page(request, "models.html", {"session": session, "notice": notice, **found})


def _notice(deployed: str | None, done: str | None, name: str | None) -> str | None:
    """What the button before did, from fixed sentences (no text of the URL's own is shown)."""
    if deployed:
        return f"Deployed: deployment {deployed} is starting."
    if done in ("rollback", "promote") and name:
        return f"{'Rolled back' if done == 'rollback' else 'Promoted'} {name!r}."
    return None


# --- buttons -------------------------------------------------------------------------------------


@router.post("/deployments")
async def deploy(
    request: Request,
    session: SessionDep,
    model: Annotated[str, Form(min_length=1, max_length=256)],
    served_name: Annotated[str, Form(max_length=128)] = "",
    csrf: Csrf = None,
) -> Response:
    check_change(request, session, csrf, "Deploy")
    created = await data.deploy(api(request, session, "write"), model, served_name.strip() or None)
    return _see_other(f"/ui/models?deployed={segment(created['id'])}")


@router.post("/served_names/{name}/{action}")
async def served_name_action(
    request: Request, session: SessionDep, name: str, action: str, csrf: Csrf = None
) -> Response:
    if action not in ("rollback", "promote"):
        raise UiError(404, f"action: {action[:40]!r} is neither rollback nor promote")
    check_change(request, session, csrf, action.capitalize())
    await data.served_name_action(api(request, session, "write"), name, action)
    return _see_other(f"/ui/models?done={action}&name={segment(name)}")
