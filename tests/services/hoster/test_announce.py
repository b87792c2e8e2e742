"""The hoster's re-announcement of what it serves (services/hoster/announce.py): every ready or
cold deployment as `deployment.ready` (cold said), every served name's current state, and
nothing of a stopped, failed or pending one, read from its real tables."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from services.hoster.announce import live_state
from services.hoster.models import Deployment
from services.hoster.served_names import ServedNames
from services.ingest.gateway.routing import RoutingTable
from shared.db import make_engine, session_scope
from shared.events import DeploymentReady, ServedNameChanged


@pytest.fixture
def database(sqlite_url: URL) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def _deployment(database: Engine, name: str, status: str, port: int | None) -> Deployment:
    url = f"http://127.0.0.1:{port}/v1" if port else None
    row = Deployment(
        id=f"dep-{name}", tenant="acme", version_id=f"mv-{name}", served_model_name=f"ft:{name}",
        status=status, endpoint_url=url,
    )  # fmt: skip
    with session_scope(database) as session:
        session.add(row)
        session.commit()
        session.refresh(row)
        return row


def test_every_live_deployment_and_served_name_is_told_again_as_it_is_now(
    database: Engine,
) -> None:
    warm = _deployment(database, "warm", "ready", 9001)
    _deployment(database, "idle", "cold", 9002)  # unloaded: keeps its last address
    _deployment(database, "gone", "stopped", 9003)
    _deployment(database, "broken", "failed", None)
    _deployment(database, "loading", "pending", None)
    ServedNames(database).attach(warm, "tickets", "primary", percent=None, policy=None)

    events = live_state(database)
    ready = [e for e in events if isinstance(e, DeploymentReady)]
    assert [(e.deployment_id, e.endpoint_url, e.version_id, e.cold) for e in ready] == [
        ("dep-warm", "http://127.0.0.1:9001/v1", "mv-warm", False),
        ("dep-idle", "http://127.0.0.1:9002/v1", "mv-idle", True),
    ]
    (served,) = [e for e in events if isinstance(e, ServedNameChanged)]
    assert (served.name, served.revision) == ("tickets", 1)
    assert served.primary is not None
    assert served.primary.deployment_id == "dep-warm"

    # A gateway that knew none of it (the first announcements past the stream's retention)
    # routes all of it from these alone, the cold one to be woken by its next call.
    table = RoutingTable([])
    for event in ready:
        table.add_deployment(
            tenant=event.tenant, served_model_name=event.served_model_name,
            deployment_id=event.deployment_id, endpoint_url=event.endpoint_url,
            version_id=event.version_id, cold=event.cold,
        )  # fmt: skip
    table.set_served(served)
    by_name = table.resolve("openai", "tickets", "acme")
    idle = table.resolve("openai", "ft:idle", "acme")
    assert by_name is not None
    assert idle is not None
    assert (by_name.upstream, table.is_cold(by_name)) == ("deployment:dep-warm", False)
    assert (idle.upstream, table.is_cold(idle)) == ("deployment:dep-idle", True)
    assert table.resolve("openai", "ft:gone", "acme") is None
