"""A run's credential after a restart: the caller's key lived only in the process that died, and
is never stored. A run that still needs a model (a `completions` run's answers, a judge's
grades) goes on with a key of its own: an `internal` key of the run's tenant, minted by this
evaluator for this run, held in memory only, and revoked when the run's task ends.

Why an internal key of the tenant: the gateway routes and bills by the key's tenant, so the run
reaches what its tenant reaches, as the caller's key did; `internal` is the narrowest scope that
calls the gateway (it changes no data), and it is minted here, on the evaluator's own database
access, never by a request over HTTP (docs/keys.md). It goes on only while the key that started
the run (its id is stored, `caller_key_id`) is still valid: a revoked caller's run stops.
Blocking (each call one short transaction): run them in a thread.
"""

from __future__ import annotations

import contextlib
import logging

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from services.evaluator.models import EvalsRunRow
from shared import auth
from shared.db import session_scope

log = logging.getLogger("tuneloop.evaluator")
KEY_NAME = "evaluator: resumes eval run {run_id}"


class CallerGone(Exception):
    """The key that started the run is revoked or gone: the run does not go on with another."""


def _check_caller(session: Session, run: EvalsRunRow) -> None:
    if run.caller_key_id is None:  # a run from before keys' ids were kept
        raise CallerGone("the run does not say which API key started it")
    key = session.get(auth.ApiKey, run.caller_key_id)
    if key is None or key.tenant_id != run.tenant:
        raise CallerGone("the API key that started this run no longer exists")
    if key.revoked_at is not None:
        raise CallerGone(f"the API key that started this run ({key.prefix}) was revoked")


def mint(engine: Engine, run: EvalsRunRow) -> str:
    """A new internal key of the run's tenant for this run (its id stored on the run, so a
    process that dies holding it has it revoked by the next); CallerGone when the caller's key
    is revoked or gone."""
    with session_scope(engine) as session:
        _check_caller(session, run)
        row, plaintext = auth.issue_api_key(
            session, tenant_id=run.tenant, name=KEY_NAME.format(run_id=run.id), scope="internal"
        )
        stored = session.get(EvalsRunRow, run.id)
        if stored is not None:
            stored.resume_key_id = row.id
            session.add(stored)
    return plaintext


def revoke(engine: Engine, run_id: str) -> None:
    """Revoke the key minted for the run, if one is still held (idempotent)."""
    with session_scope(engine) as session:
        run = session.get(EvalsRunRow, run_id)
        if run is None or run.resume_key_id is None:
            return
        with contextlib.suppress(auth.ApiKeyNotFoundError):  # gone with its tenant
            auth.revoke_api_key(session, tenant_id=run.tenant, key_id=run.resume_key_id)
        run.resume_key_id = None
        session.add(run)


def sweep(engine: Engine) -> int:
    """Revoke every key minted by a process that is gone (its plaintext went with it); how many."""
    with session_scope(engine) as session:
        held = session.exec(
            select(EvalsRunRow.id).where(col(EvalsRunRow.resume_key_id).is_not(None))
        ).all()
    for run_id in held:
        revoke(engine, run_id)
    if held:
        log.info("revoked %d eval-run keys a previous process minted", len(held))
    return len(held)
