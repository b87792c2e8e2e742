"""What the hoster publishes when a deployment fails: `deployment.failed` names the version's ft:
name and the served name it was deployed under, whether its warm-up failed at launch or its
engine kept dying afterwards (the watchdog), so a notification rule filtered by served name is
told of its own name's failures only. Engines that record what they are asked
(fake_engines.py); the real database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from services.hoster.served_names import ServedNames
from services.hoster.state import Hoster
from shared.db import make_engine
from shared.events import DeploymentFailed, Event
from tests.services.hoster.fake_engines import Calls, FakeEngine, make_deployments, register


class Published(list[Event]):
    async def __call__(self, event: Event) -> None:
        self.append(event)

    def failed(self) -> list[DeploymentFailed]:
        return [event for event in self if isinstance(event, DeploymentFailed)]


@pytest.fixture
async def database(sqlite_url: URL) -> AsyncIterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def _hoster(
    database: Engine, tmp_path: Path, published: Published, **settings: float
) -> tuple[Hoster, list[FakeEngine]]:
    deployments, engines = make_deployments(database, tmp_path, Calls(), **settings)
    hoster = Hoster(
        deployments.settings,
        tmp_path,
        deployments.store,
        database,
        published,
        None,  # type: ignore[arg-type]  # no eval engine is asked for here
        deployments,
        ServedNames(database),
    )
    return hoster, engines


async def _settled(hoster: Hoster) -> None:
    while hoster._launching:
        await asyncio.gather(*hoster._launching.values(), return_exceptions=True)


async def test_a_canary_whose_warm_up_fails_names_its_served_name(
    database: Engine, tmp_path: Path
) -> None:
    published = Published()
    hoster, engines = _hoster(database, tmp_path, published)
    await hoster.deploy("acme", register(hoster.deployments, "mv-a"), served_name="tickets")
    await _settled(hoster)
    engines[0].fail_warm_up = True
    canary = register(hoster.deployments, "mv-b")
    await hoster.deploy("acme", canary, served_name="tickets", role="canary", percent=10)
    alone = register(hoster.deployments, "mv-c")
    await hoster.deploy("acme", alone)  # under its own name only
    await _settled(hoster)

    assert [(e.served_name, e.served_model_name) for e in published.failed()] == [
        ("tickets", canary),
        (None, alone),
    ]
    assert all(e.tenant == "acme" and "answered 500" in e.reason for e in published.failed())


async def test_a_deployment_whose_engine_keeps_dying_names_its_served_name(
    database: Engine, tmp_path: Path
) -> None:
    published = Published()
    hoster, engines = _hoster(database, tmp_path, published, crash_limit=1, watch_interval_s=0.05)
    model = register(hoster.deployments, "mv-a")
    deployment = await hoster.deploy("acme", model, served_name="tickets")
    await _settled(hoster)
    watchdog = asyncio.create_task(hoster.watch())
    try:
        engines[0].running = False  # killed
        async with asyncio.timeout(10):
            while not published.failed():
                await asyncio.sleep(0.02)
    finally:
        watchdog.cancel()
    [failed] = published.failed()
    assert (failed.deployment_id, failed.served_name, failed.served_model_name) == (
        deployment.id,
        "tickets",
        model,
    )
    assert failed.reason.startswith("the engine crashed 1 times")
