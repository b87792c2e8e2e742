"""Served names in the hoster's tables: a version deployed under a name becomes its primary once
ready (the one it replaces kept for a rollback), a canary shares it until promoted or rolled
back (by hand, or on a gateway's verdict, once), an undeployed deployment leaves its places, and
every change is published whole with a growing revision."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from services.hoster.errors import Conflict, NotFound
from services.hoster.models import Deployment
from services.hoster.served_names import ServedNames
from shared.db import make_engine, session_scope
from shared.events import CanaryFailed, CanaryPolicy, DeploymentRolledBack, ServedNameChanged
from shared.ft_names import job_suffix


@pytest.fixture
def database(sqlite_url: URL) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def deployment(
    database: Engine, name: str, status: str = "ready", tenant: str = "acme"
) -> Deployment:
    row = Deployment(
        id=f"dep-{name}", tenant=tenant, version_id=f"mv-{name}", served_model_name=f"ft:{name}",
        status=status, endpoint_url=f"http://127.0.0.1:9{len(name)}/v1" if status == "ready" else None,
    )  # fmt: skip
    with session_scope(database) as session:
        session.add(row)
        session.commit()
        session.refresh(row)
        return row


def mark_ready(database: Engine, deployment_id: str) -> None:
    with session_scope(database) as session:
        row = session.get(Deployment, deployment_id)
        assert row is not None
        row.status, row.endpoint_url = "ready", "http://127.0.0.1:9000/v1"
        session.add(row)
        session.commit()


def state(events: list[object]) -> ServedNameChanged:
    [changed] = [e for e in events if isinstance(e, ServedNameChanged)]
    return changed


def test_a_switch_keeps_the_replaced_version_and_a_rollback_goes_back_to_it(
    database: Engine,
) -> None:
    names = ServedNames(database)
    first = state(names.attach(deployment(database, "v1"), "tickets", "primary", percent=None,
                               policy=None))  # fmt: skip
    assert (first.revision, first.primary and first.primary.deployment_id) == (1, "dep-v1")
    # Pending: it takes its place once ready, not before.
    assert names.attach(deployment(database, "v2", "pending"), "tickets", "primary",
                        percent=None, policy=None) == []  # fmt: skip
    mark_ready(database, "dep-v2")
    switched = state(names.ready("dep-v2"))
    assert switched.primary is not None
    assert (switched.revision, switched.primary.deployment_id) == (2, "dep-v2")
    assert names.get("acme", "tickets").previous_id == "dep-v1"
    events = names.rollback("acme", "tickets", reason="rolled back by request")
    back, rolled = state(events), events[-1]
    assert back.primary is not None
    assert (back.revision, back.primary.deployment_id) == (3, "dep-v1")
    assert isinstance(rolled, DeploymentRolledBack)
    assert (rolled.deployment_id, rolled.restored_deployment_id) == ("dep-v2", "dep-v1")
    with pytest.raises(Conflict, match="no canary, no shadow and no ready previous version"):
        names.rollback("acme", "tickets", reason="again")


def test_a_canary_shares_the_name_until_promoted_and_a_gateways_verdict_rolls_it_back_once(
    database: Engine,
) -> None:
    names = ServedNames(database)
    with pytest.raises(Conflict, match="has no primary yet"):
        names.attach(deployment(database, "c0"), "support", "canary", percent=10, policy=None)
    names.attach(deployment(database, "p1"), "support", "primary", percent=None, policy=None)
    policy = CanaryPolicy(min_requests=20, max_error_rate=0.1)
    shared = state(names.attach(deployment(database, "c1"), "support", "canary", percent=25,
                                policy=policy))  # fmt: skip
    assert shared.canary is not None
    assert (shared.canary.deployment_id, shared.canary_percent, shared.rollback) == (
        "dep-c1", 25, policy,
    )  # fmt: skip
    promoted = state(names.promote("acme", "support"))
    assert promoted.primary is not None
    assert (promoted.primary.deployment_id, promoted.canary) == ("dep-c1", None)
    assert names.get("acme", "support").previous_id == "dep-p1"
    with pytest.raises(Conflict, match="no canary or shadow to promote"):
        names.promote("acme", "support")

    names.attach(deployment(database, "c2"), "support", "canary", percent=25, policy=None)
    revision = names.get("acme", "support").revision
    verdict = CanaryFailed(tenant="acme", name="support", revision=revision, deployment_id="dep-c2",
                           requests=20, errors=8, p95_ms=31.0, reason="error rate 40.0% > 10.0%")  # fmt: skip
    events = names.rollback("acme", "support", reason=verdict.reason, failed=verdict)
    back, rolled = state(events), events[-1]
    assert back.primary is not None
    assert (back.primary.deployment_id, back.canary, back.canary_percent) == ("dep-c1", None, 0.0)
    assert isinstance(rolled, DeploymentRolledBack)
    assert (rolled.deployment_id, rolled.requests, rolled.errors) == ("dep-c2", 20, 8)
    # Another gateway's verdict on the same canary: rolled back already, nothing more.
    assert names.rollback("acme", "support", reason=verdict.reason, failed=verdict) == []


def test_an_undeployed_deployment_leaves_its_places_and_names_are_the_tenants_own(
    database: Engine,
) -> None:
    names = ServedNames(database)
    names.attach(deployment(database, "a"), "chat", "primary", percent=None, policy=None)
    names.attach(deployment(database, "b"), "chat", "canary", percent=50, policy=None)
    left = state(names.stopped("dep-b"))
    assert left.canary is None
    assert names.get("acme", "chat").canary_id is None
    assert names.stopped("dep-b") == []  # holds nothing any more
    with pytest.raises(NotFound):
        names.get("globex", "chat")
    assert [row.name for row in names.list_for("globex")] == []
    # A relaunched engine (a restarted hoster) is announced again at its new address.
    again = state(names.ready("dep-a"))
    assert again.revision == names.get("acme", "chat").revision


def test_a_shadow_is_mirrored_a_share_and_promoted_or_rolled_back_like_a_canary(
    database: Engine,
) -> None:
    names = ServedNames(database)
    with pytest.raises(Conflict, match="then the shadow"):
        names.attach(deployment(database, "s0"), "mirror", "shadow", percent=20, policy=None)
    names.attach(deployment(database, "m1"), "mirror", "primary", percent=None, policy=None)
    mirrored = state(names.attach(deployment(database, "s1"), "mirror", "shadow", percent=20,
                                  policy=None))  # fmt: skip
    assert mirrored.shadow is not None
    assert (mirrored.shadow.deployment_id, mirrored.shadow_percent) == ("dep-s1", 20.0)
    assert (mirrored.canary, mirrored.canary_percent) == (None, 0.0)
    events = names.rollback("acme", "mirror", reason="its pairwise score lost")
    assert state(events).shadow is None
    rolled = events[-1]
    assert isinstance(rolled, DeploymentRolledBack)
    assert (rolled.deployment_id, rolled.restored_deployment_id) == ("dep-s1", "dep-m1")
    names.attach(deployment(database, "s2"), "mirror", "shadow", percent=20, policy=None)
    # A shadow is promoted on its pairwise score (test_shadow_promote.py), or when forced.
    with pytest.raises(Conflict, match="no pairwise score yet"):
        names.promote("acme", "mirror")
    promoted = state(names.promote("acme", "mirror", force=True))
    assert promoted.primary is not None
    assert (promoted.primary.deployment_id, promoted.shadow) == ("dep-s2", None)


def test_an_auto_deployed_versions_served_name_is_its_jobs_suffix() -> None:
    assert job_suffix("ft:SmolLM2-135M-Instruct:tickets:ftjob-1") == "tickets"
    assert job_suffix("ft:SmolLM2-135M-Instruct::ftjob-1") == ""
    assert job_suffix("ft:s3://bucket/tenants/acme/models/m:support:ftjob-2") == "support"
