"""Keeping deployments' engines as the table wants them, with engines that record what they are
asked: a dead engine's deployments (a shared engine's all at once) are started again until they
keep dying; at start-up a live shared engine is adopted with the adapters it still has and a dead
one's deployments are launched again; a deployment idle past `idle_unload_s` is unloaded and
goes cold unless pinned (the engine stops with the last one), and a wake loads it again, warmed
up before it is ready. The whole path with real engines: test_shared_engines_service.py (wake,
cold) and test_hoster_service.py (kill -9, restart)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from services.hoster import upkeep
from services.hoster.deployments import Deployments
from shared.db import make_engine
from tests.services.hoster.checkpoints import BASE_ID
from tests.services.hoster.fake_engines import Calls, make_deployments, register


@pytest.fixture
def database(sqlite_url: URL) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def deploy(deployments: Deployments, model: str, *, pinned: bool = False) -> str:
    deployment, _ = deployments.request("acme", model, pinned=pinned)
    assert deployments.launch(deployment.id).status == "ready"
    return deployment.id


def test_a_dead_engine_is_started_again_until_it_keeps_dying(
    database: Engine, tmp_path: Path
) -> None:
    deployments, engines = make_deployments(database, tmp_path, Calls(), crash_limit=3,
                                            crash_window_s=60)  # fmt: skip
    a, b = register(deployments, "mv-a"), register(deployments, "mv-b")
    ids = [deploy(deployments, a), deploy(deployments, b)]  # one shared engine
    for crash, at in enumerate((0.0, 10.0), start=1):
        engines[-1].running = False
        assert upkeep.crashed(deployments, at) == (ids, []), crash
        assert {deployments.find(d).status for d in ids} == {"pending"}
        for deployment_id in ids:  # the first starts a new engine, the second loads onto it
            assert deployments.launch(deployment_id).status == "ready"
        assert len(engines) == crash + 1
    engines[-1].running = False
    again, failed = upkeep.crashed(deployments, 20.0)
    assert again == []
    assert [f.status for f in failed] == ["failed", "failed"]
    assert failed[0].error == "the engine crashed 3 times within 60 s; its log ends: Killed"
    assert upkeep.crashed(deployments, 30.0) == ([], [])  # forgotten once handled


def test_a_restarted_hoster_adopts_a_live_shared_engine_and_relaunches_a_dead_ones(
    database: Engine, tmp_path: Path
) -> None:
    calls = Calls()
    before, engines = make_deployments(database, tmp_path, calls)
    a, b, c = (register(before, f"mv-{n}") for n in "abc")
    ids = [deploy(before, a), deploy(before, b)]
    pending, _ = before.request("acme", c)  # the old hoster died before launching it
    shared = engines[0]
    calls.alive_pids.add(shared.port)  # still running after the hoster went

    after, adopted = make_deployments(database, tmp_path, calls)
    assert upkeep.recover(after) == [pending.id]
    [engine] = adopted
    assert (engine.engine_id, engine.pid, engine.port) == (shared.engine_id, shared.port,
                                                            shared.port)  # fmt: skip
    assert (engine.spec.base_name, engine.spec.serve_base) == (BASE_ID, False)
    hosted = after.pool.of(ids[0])
    assert hosted is not None
    assert set(hosted.names) == set(ids)
    assert after.launch(pending.id).status == "ready"  # onto the adopted engine
    assert calls.made[-2:] == [("load", shared.engine_id, c), ("warm_up", shared.engine_id, c)]

    calls.alive_pids.clear()  # now the engine is gone too
    again, relaunched = make_deployments(database, tmp_path, calls)
    assert sorted(upkeep.recover(again)) == sorted([*ids, pending.id])
    assert {again.find(d).status for d in ids} == {"pending"}
    assert relaunched[0].alive() is False


def test_an_adapter_the_adopted_engine_lost_is_loaded_again(
    database: Engine, tmp_path: Path
) -> None:
    calls = Calls()
    before, engines = make_deployments(database, tmp_path, calls)
    ids = [deploy(before, register(before, f"mv-{n}")) for n in "ab"]
    calls.alive_pids.add(engines[0].port)
    del calls.processes[engines[0].port][f"ft:{BASE_ID}:x:mv-b"]  # its unload raced a restart
    after, _ = make_deployments(database, tmp_path, calls)
    assert upkeep.recover(after) == [ids[1]]  # loaded again by its launch
    assert after.launch(ids[1]).status == "ready"
    assert [c[0] for c in calls.made[-2:]] == ["load", "warm_up"]


def test_an_idle_deployment_goes_cold_unless_pinned_and_a_wake_loads_it_again(
    database: Engine, tmp_path: Path
) -> None:
    calls = Calls()
    deployments, engines = make_deployments(database, tmp_path, calls, idle_unload_s=60)
    a, b = register(deployments, "mv-a"), register(deployments, "mv-b")
    kept, idle = deploy(deployments, a, pinned=True), deploy(deployments, b)
    engine = engines[0]
    engine.idle = {a: 59.0, b: 59.0}
    assert upkeep.idle(deployments) == []
    engine.idle = {a: 600.0, b: 60.0}
    [cold] = upkeep.idle(deployments)
    assert (cold.id, cold.status, cold.endpoint_url) == (idle, "cold", engine.base_url)
    assert calls.made[-1] == ("unload", engine.engine_id, b)
    assert deployments.find(kept).status == "ready"  # pinned

    woken, started = deployments.wake(idle)
    assert (woken.status, started) == ("pending", True)
    assert deployments.wake(idle)[1] is False  # a second wake shares the first one's launch
    assert deployments.launch(idle).status == "ready"
    assert calls.made[-2:] == [("load", engine.engine_id, b), ("warm_up", engine.engine_id, b)]

    deployments.request("acme", a, pinned=False)  # unpinned: it may go cold now
    engine.idle = {a: 600.0, b: 600.0}
    assert sorted(d.id for d in upkeep.idle(deployments)) == sorted([kept, idle])
    assert calls.made[-1] == ("stop", engine.engine_id)  # nothing left on it
    deployments.wake(idle)
    assert deployments.launch(idle).status == "ready"  # a fresh engine, warmed up by name
    assert [c[0] for c in calls.made[-2:]] == ["start", "warm_up"]
    assert deployments.find(kept).status == "cold"


def test_nothing_goes_cold_when_the_timeout_is_off_or_the_engine_cannot_say(
    database: Engine, tmp_path: Path
) -> None:
    for settings, lists in (({"idle_unload_s": 0}, True), ({"idle_unload_s": 1}, False)):
        deployments, engines = make_deployments(database, tmp_path, Calls(), **settings)
        name = register(deployments, f"mv-{len(settings)}-{lists}")
        deploy(deployments, name)
        engines[0].idle, engines[0].lists_names = {name: 1e9}, lists
        assert upkeep.idle(deployments) == []
