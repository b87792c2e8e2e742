"""A served name's shadow promoted or taken out by its pairwise score, on a real hoster process
(real NATS, S3, SQLite, engines): the evaluator's `eval.shadow_scored` is published on the bus;
promote refuses a shadow with no score, an `undecided` or a `worse` one (409 with the numbers)
unless forced, promotes a `better` one, and a `worse` one is taken out by itself
(`deployment.rolled_back`, reason `shadow_worse`, with the score) unless the name's policy says
not to. A canary's promote is unchanged (test_hoster_service.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from faststream.nats import NatsBroker

from shared import bus
from shared.dev import localstack
from shared.events import (
    DEPLOYMENTS,
    DeploymentRolledBack,
    PairwiseScore,
    ServedNameChanged,
    ShadowScored,
)
from shared.settings import Settings
from tests.plugins.infra import RunningProcess
from tests.services.hoster.checkpoints import BASE_ID, store_checkpoint
from tests.services.hoster.process import Hoster, decision, event_broker, hoster_process, next_event

pytestmark = pytest.mark.slow
NAME = "mirror"


@pytest.fixture(scope="module")
def hoster(
    nats_server: RunningProcess,
    s3_server: RunningProcess,
    stack_settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
) -> Iterator[Hoster]:
    env = {"TUNELOOP_HOSTER_ENGINE_LOAD_TIMEOUT_S": "240"}
    tmp = tmp_path_factory.mktemp("hoster-shadow")
    with hoster_process(tmp, stack_settings, tiny_model_dir, env) as hoster:
        yield hoster


@pytest.fixture
async def broker(hoster: Hoster) -> AsyncIterator[NatsBroker]:
    async with event_broker(hoster.settings, "hoster-shadow-tests") as broker:
        yield broker


def score(
    verdict: Literal["better", "worse", "undecided"], wins: int, losses: int
) -> PairwiseScore:
    decided = wins + losses
    return PairwiseScore(
        pairs=decided + 1, shadow_wins=wins, primary_wins=losses, ties=0, judge_errors=1,
        shadow_failures=0, decided=decided, win_rate=wins / decided, low=0.1, high=0.9,
        min_pairs=20, verdict=verdict,
    )  # fmt: skip


async def state_with(broker: NatsBroker, hoster: Hoster, where: str, test: Any) -> dict[str, Any]:
    """The name's next served_name_changed that passes `test` (`where` says what is awaited)."""
    return await next_event(
        broker, ServedNameChanged, hoster.tenant, DEPLOYMENTS.name, 300,
        skip=lambda e: e["name"] != NAME or not test(e),
    )  # fmt: skip


async def shadow(broker: NatsBroker, hoster: Hoster, model: str) -> dict[str, Any]:
    """Deploy `model` as the name's shadow; its served_name_changed once it is in place."""
    body = {"model": model, "served_name": NAME, "shadow_percent": 20}
    revision = hoster.get(f"/v1/served_names/{NAME}").json()["revision"]
    created = hoster.send("POST", "/v1/deployments", json=body)
    assert created.status_code == 200, created.text
    wanted = created.json()["id"]
    return await state_with(
        broker, hoster, "shadow",
        lambda e: e["revision"] > revision and (e["shadow"] or {}).get("deployment_id") == wanted,
    )  # fmt: skip


async def scored(
    broker: NatsBroker, hoster: Hoster, state: dict[str, Any], value: PairwiseScore
) -> dict[str, Any]:
    """Publish the evaluator's score of the state's versions; the name once the hoster has it."""
    event = ShadowScored(
        tenant=hoster.tenant, name=NAME, primary_version=state["primary"]["version_id"],
        shadow_version=state["shadow"]["version_id"], score=value,
    )  # fmt: skip
    await bus.publish(broker, event)
    found: dict[str, Any] = {}

    def kept() -> bool:
        nonlocal found
        found = hoster.get(f"/v1/served_names/{NAME}").json()
        return found.get("shadow_score") == value.model_dump()

    assert localstack.wait_until(kept, 30, interval_s=0.2), found
    return found


def promote(hoster: Hoster, force: bool | None = None) -> Any:
    body = {"force": force} if force is not None else None
    return hoster.send("POST", f"/v1/served_names/{NAME}/promote", json=body)


async def test_a_shadow_is_promoted_on_its_score_and_a_worse_one_taken_out(
    hoster: Hoster, broker: NatsBroker
) -> None:
    models = []
    for n, job in enumerate(("ftjob-mirror-1", "ftjob-mirror-2"), start=1):
        uri = store_checkpoint(
            hoster.store, hoster.work, tenant=hoster.tenant, job_id=job, step=10, seed=n
        )
        model = f"ft:{BASE_ID}:m:{job}"
        await bus.publish(broker, decision(hoster.tenant, job, uri, auto_deploy=False,
                                           fine_tuned_model=model))  # fmt: skip
        models.append(model)
    assert localstack.wait_until(
        lambda: {m["id"] for m in hoster.get("/v1/models").json()["data"]} >= set(models), 60
    )
    first, second = models
    created = hoster.send("POST", "/v1/deployments", json={"model": first, "served_name": NAME})
    assert created.status_code == 200, created.text
    await state_with(broker, hoster, "primary", lambda e: e["primary"] is not None)
    state = await shadow(broker, hoster, second)
    shadow_id = state["shadow"]["deployment_id"]

    refused = promote(hoster)
    assert refused.status_code == 409
    assert "no pairwise score yet" in refused.json()["detail"]
    await scored(broker, hoster, state, score("undecided", 6, 4))
    refused = promote(hoster)
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert "undecided: win rate 0.60 (95 % interval 0.10-0.90) over 10 decided pairs" in detail
    assert "6 shadow wins, 4 primary wins, 0 ties; 1 judge errors" in detail
    assert refused.json()["error"]["shadow_score"]["verdict"] == "undecided"

    better = await scored(broker, hoster, state, score("better", 18, 2))
    assert better["shadow"] == shadow_id
    promoted = promote(hoster)
    assert promoted.status_code == 200, promoted.text
    assert (promoted.json()["primary"], promoted.json()["shadow"]) == (shadow_id, None)
    assert promoted.json()["shadow_score"] is None  # a score is about one shadow

    # The first version back as the shadow; with the policy keeping a worse shadow, it stays,
    # promote refuses it, and a forced promote promotes it.
    off = hoster.send(
        "POST", f"/v1/served_names/{NAME}", json={"rollback": {"shadow_worse": False}}
    )
    assert off.status_code == 200, off.text
    state = await shadow(broker, hoster, first)
    kept = await scored(broker, hoster, state, score("worse", 2, 18))
    assert kept["shadow"] == state["shadow"]["deployment_id"]
    assert promote(hoster, force=False).status_code == 409
    forced = promote(hoster, force=True)
    assert forced.status_code == 200, forced.text
    assert forced.json()["primary"] == state["shadow"]["deployment_id"]

    # With the policy's default, a worse shadow is taken out by itself.
    on = hoster.send("POST", f"/v1/served_names/{NAME}", json={"rollback": {"shadow_worse": True}})
    assert on.status_code == 200, on.text
    state = await shadow(broker, hoster, second)
    worse = score("worse", 1, 19)
    await bus.publish(broker, ShadowScored(
        tenant=hoster.tenant, name=NAME, primary_version=state["primary"]["version_id"],
        shadow_version=state["shadow"]["version_id"], score=worse,
    ))  # fmt: skip
    rolled = await next_event(
        broker, DeploymentRolledBack, hoster.tenant, DEPLOYMENTS.name, 30,
        skip=lambda e: e["name"] != NAME or e["reason"] != "shadow_worse",
    )  # fmt: skip
    assert rolled["deployment_id"] == state["shadow"]["deployment_id"]
    assert rolled["restored_deployment_id"] == state["primary"]["deployment_id"]
    assert rolled["shadow_score"] == worse.model_dump()
    after = hoster.get(f"/v1/served_names/{NAME}").json()
    assert (after["shadow"], after["shadow_score"]) == (None, None)
    assert after["primary"] == state["primary"]["deployment_id"]
    for deployment in hoster.get("/v1/deployments").json()["data"]:
        if deployment["status"] == "ready":
            hoster.send("DELETE", f"/v1/deployments/{deployment['id']}")
