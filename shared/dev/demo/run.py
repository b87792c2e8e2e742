"""`make demo`: the whole loop on one machine, driven only through the gateway with the `openai` SDK.

Starts the stack (and the teacher), replays the demo's training tickets through the gateway to
the teacher, builds a dataset from what was captured, fine-tunes SmolLM2-135M-Instruct with auto
hyperparameters and auto-deploy, shows training with mid-run task scores, asks the deployed
`ft:` model, and compares base, fine-tuned and teacher on held-out tickets the training never
saw. Exits non-zero when the fine-tuned model's field accuracy is under the goal.

`--retrain` turns the loop twice: the first version learns from the first `--first` tickets on a
shorter budget, then a retrain policy trains the next one from all the traffic once the rest has
arrived, and it must become the served name's canary (shared/dev/demo/retrain.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from openai import AsyncOpenAI, OpenAI
from rich.table import Table

from shared import auth, db
from shared.dev import supervisor
from shared.dev.demo import retrain
from shared.dev.demo.steps import (
    BASE,
    Scored,
    compare,
    console,
    dataset,
    deployed,
    messages,
    replay,
)
from shared.dev.demo.steps import train as train_job
from shared.dev.demo.tickets import TEACHER_MODEL, generate
from shared.settings import Settings, get_settings

TENANT = "demo"
GOAL = 0.9


def issue_key(settings: Settings, tenant: str = TENANT, name: str = "make demo") -> str:
    """A key of `tenant` (created if new) in the local stack's database."""
    engine = db.make_engine(settings.database_url)
    try:
        with db.session_scope(engine) as session:
            auth.ensure_tenant(session, tenant_id=tenant)
            _, plaintext = auth.issue_api_key(session, tenant_id=tenant, name=name)
            return plaintext
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--budget-s", type=float, default=400.0, help="the job's max_duration_s")
    parser.add_argument("--heldout", type=int, default=50, help="held-out tickets compared")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    parser.add_argument(
        "--retrain", action="store_true", help="then a retrain policy trains the next version"
    )
    parser.add_argument(
        "--first", type=int, default=150, help="with --retrain: the tickets of the first version"
    )
    parser.add_argument(
        "--first-budget-s", type=float, default=330.0, help="with --retrain: its max_duration_s"
    )
    args = parser.parse_args(argv)
    settings = get_settings()
    started_at = time.monotonic()
    console.rule("tuneloop demo: support tickets -> JSON, SmolLM2-135M-Instruct on this machine")
    supervisor.up(settings)
    try:
        return _run(settings, args, started_at)
    finally:
        if not args.keep:
            supervisor.down(settings)


def _run(settings: Settings, args: argparse.Namespace, started_at: float) -> int:
    def step(message: str) -> None:
        minutes, seconds = divmod(round(time.monotonic() - started_at), 60)
        console.print(f"[dim]{minutes}:{seconds:02d}[/] {message}")

    key = issue_key(settings)
    base_url = f"http://{settings.app.bind_host}:{settings.services.ingest_port}"
    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=600)

    def aclient() -> AsyncOpenAI:
        # One per event loop: a client's connection pool belongs to the loop that opened it.
        return AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=600)

    http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    # A run that stopped half-way left its deployments serving (and its served name taken).
    _stop_deployments(http)
    train, heldout = generate("train"), generate("heldout")[: args.heldout]
    first = train[: args.first] if args.retrain else train
    budget_s = args.first_budget_s if args.retrain else args.budget_s
    step(f"1. replaying {len(first)} tickets through the gateway to {TEACHER_MODEL}")
    since = datetime.now(UTC)
    asyncio.run(replay(aclient(), first))
    step("2. building a dataset from the captured calls")
    dataset_id = dataset(http, len(first), since)
    step(f"3. fine-tuning {BASE} on {dataset_id} (auto hyperparameters, auto-deploy)")
    # The base is compared at the end: its engine loads now, while the job starts.
    http.post("/v1/deployments", json={"model": BASE}).raise_for_status()
    job = train_job(client, dataset_id, budget_s)
    name = job.fine_tuned_model
    if getattr(job, "gate", None) == "rejected":
        reason = http.get(f"/v1/evals/{job.id}").json().get("decision", {}).get("gate_reason")
        raise SystemExit(f"demo: {name} was not deployed: {reason}")
    step(f"4. waiting for {name} to serve (gate: {getattr(job, 'gate', None)})")
    deployed(http, name)
    answer = client.chat.completions.create(model=name, messages=messages(heldout[0]))
    console.print(f"   {name} answers: {answer.choices[0].message.content}")
    stream = client.chat.completions.create(model=name, messages=messages(heldout[1]), stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    console.print(f"   streamed: {streamed}")
    models, judged = {"base": BASE, "fine-tuned": name}, "fine-tuned"
    if args.retrain:
        rest = train[args.first :]
        newer = retrain.next_version(client, http, aclient, rest, since, args.budget_s, step)
        models, judged = {"base": BASE, "first version": name, "retrained": newer}, "retrained"
    step(f"{'10' if args.retrain else '5'}. comparing on {len(heldout)} held-out tickets")
    deployed(http, BASE)
    scores = asyncio.run(compare(aclient(), models, heldout))
    scores |= asyncio.run(compare(aclient(), {"teacher": TEACHER_MODEL}, heldout))
    _report(scores, judged, job, time.monotonic() - started_at)
    if not args.keep:
        _stop_deployments(http)  # engines outlive the hoster (a restart takes them over)
    return 0 if scores[judged].accuracy >= GOAL else 1


def _stop_deployments(http: httpx.Client) -> None:
    for deployment in http.get("/v1/deployments").json().get("data", []):
        http.delete(f"/v1/deployments/{deployment['id']}")


def _report(scores: dict[str, Scored], judged: str, job: Any, elapsed_s: float) -> None:
    table = Table(title="held-out tickets: field accuracy")
    for column in ("model", "field accuracy", "median latency"):
        table.add_column(column)
    for label, scored in scores.items():
        table.add_row(label, f"{scored.accuracy:.3f}", f"{scored.latency_s:.2f} s")
    console.print(table)
    verdict = "met" if scores[judged].accuracy >= GOAL else "MISSED"
    console.print(f"goal ({judged} >= {GOAL}): {verdict}; wall clock {elapsed_s / 60:.1f} min")
    name = job.fine_tuned_model
    console.print(
        f"next: GET /v1/fine_tuning/jobs/{job.id}/events (every decision), "
        f"/checkpoints (scores), GET /v1/models/{name}, GET /v1/samples?model={name}"
    )


if __name__ == "__main__":
    sys.exit(main())
