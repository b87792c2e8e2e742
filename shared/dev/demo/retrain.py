"""`make demo ARGS=--retrain`: the loop's second turn on the demo task, started by a policy.

The first version was trained by hand on the first of the team's traffic. A retrain policy then
takes over: it counts the calls captured from its creation on (`new_since`), and once the next
batch has arrived it builds a dataset of all the traffic, trains, and the evaluator scores the new
version against the one serving `tickets` on the same eval items. If it is at least as good it
becomes the served name's canary; if not it is registered only, and the demo fails saying why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
from openai import AsyncOpenAI, OpenAI

from shared.dev.demo import steps
from shared.dev.demo.tickets import TEACHER_MODEL, Ticket

POLICY = "tickets"
POLICIES = "/v1/fine_tuning/retrain_policies"


def next_version(
    client: OpenAI,
    http: httpx.Client,
    aclient: Callable[[], AsyncOpenAI],
    tickets: list[Ticket],
    since: datetime,
    budget_s: float,
    step: Callable[[str], None],
) -> str:
    """The retrained version's model name once it serves as the canary of `tickets`."""
    policy = _policy(http, since, len(tickets), budget_s)
    step(f"6. retrain policy {POLICY!r} ({policy['id']}): due at {len(tickets)} new samples")
    step(f"7. the team's next {len(tickets)} tickets through the gateway")
    asyncio.run(steps.replay(aclient(), tickets))

    def fired() -> str | None:
        state = http.get(f"{POLICIES}/{policy['id']}").json()
        if state.get("last_error"):
            raise SystemExit(f"demo: the retrain policy did not run: {state['last_error']}")
        return state["last_job_id"] if state["runs"] >= 1 else None

    job_id: str = steps.wait("the retrain policy's run", fired, 300, every_s=2)
    step(f"8. the policy started job {job_id} on all the traffic")
    job = steps.follow(client, job_id)
    decision = http.get(f"/v1/evals/{job_id}").json().get("decision") or {}
    steps.console.print(f"   {decision.get('gate_reason', 'no decision recorded')}")
    if decision.get("beats_serving") is not True:
        raise SystemExit("demo: the retrained version did not beat the serving one (above)")
    name: str = job.fine_tuned_model
    step(f"9. waiting for {name} to serve as the canary of {steps.SUFFIX!r}")
    steps.wait("the canary", lambda: _canary(http) == name, 600, every_s=2)
    return name


def _policy(http: httpx.Client, since: datetime, count: int, budget_s: float) -> dict[str, Any]:
    # An earlier demo's policy of the same name (the data dir outlives the stack) goes first.
    for old in http.get(POLICIES).json()["data"]:
        if old["name"] == POLICY:
            http.delete(f"{POLICIES}/{old['id']}").raise_for_status()
    created = http.post(
        POLICIES,
        json={
            "name": POLICY,
            "source": {"models": [TEACHER_MODEL], "since": since.isoformat()},
            "split": steps.SPLIT,
            "cleaning": steps.CLEANING,
            "trigger": {"min_new_samples": count},
            "job": {"model": steps.BASE, "suffix": steps.SUFFIX, "max_duration_s": budget_s},
            "auto_deploy": True,
            "new_since": int(time.time()),
        },
    )
    if created.is_error:
        raise SystemExit(f"demo: creating the retrain policy: {created.status_code} {created.text}")
    policy: dict[str, Any] = created.json()
    return policy


def _canary(http: httpx.Client) -> str | None:
    """The model the served name's canary answers with, once its deployment is ready."""
    served = http.get(f"/v1/served_names/{steps.SUFFIX}")
    if served.status_code == 404:
        return None
    served.raise_for_status()
    canary = served.json().get("canary")
    if canary is None:
        return None
    deployment = http.get(f"/v1/deployments/{canary}").json()
    if deployment.get("status") == "failed":
        raise SystemExit(f"demo: the canary's deployment failed: {deployment.get('error')}")
    return deployment.get("model") if deployment.get("status") == "ready" else None
