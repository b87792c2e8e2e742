"""Which engine a deployment runs on, with engines that record what they are asked: a tenant's
LoRA versions of one base share one engine (the first starts it, the next load their adapter
onto it, each is warmed up by name before it is ready, undeploying unloads, the last one out
stops it); another tenant, a full fine-tune and a catalogue base get engines of their own; a
warm-up that fails fails the deployment and takes its adapter off. Real engines:
test_shared_engines_service.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL

from services.hoster.deployments import Deployments
from services.hoster.engines import EngineSpec
from shared.db import make_engine
from tests.services.hoster.checkpoints import BASE_ID
from tests.services.hoster.fake_engines import Calls, FakeEngine, make_deployments, register


@pytest.fixture
def database(sqlite_url: URL) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def deploy(deployments: Deployments, model: str, tenant: str = "acme") -> str:
    deployment, new = deployments.request(tenant, model)
    assert new
    assert deployments.launch(deployment.id).status == "ready"
    return deployment.id


def test_versions_of_one_base_share_an_engine_warmed_up_per_name(
    database: Engine, tmp_path: Path
) -> None:
    calls = Calls()
    deployments, engines = make_deployments(database, tmp_path, calls)
    a, b = register(deployments, "mv-a"), register(deployments, "mv-b")
    first, second = deploy(deployments, a), deploy(deployments, b)

    [engine] = engines
    assert engine.spec.models == {a: deployments.root / "versions/mv-a/checkpoint/model"}
    assert engine.spec.base_name == BASE_ID
    assert not engine.spec.serve_base  # only the deployments' names answer
    eid = engine.engine_id
    assert calls.made == [
        ("start", eid, a), ("warm_up", eid, a),  # a fresh engine, then its name answered once
        ("load", eid, b), ("warm_up", eid, b),  # onto the running base: no second start
    ]  # fmt: skip
    rows = [deployments.find(first), deployments.find(second)]
    assert {(r.endpoint_url, r.engine_id, r.pid) for r in rows} == {
        (engine.base_url, eid, engine.pid)
    }

    deployments.stop("acme", first)
    assert calls.made[-1] == ("unload", eid, a)
    assert engine.alive()  # b is still on it
    deployments.stop("acme", second)
    assert calls.made[-1] == ("stop", eid)  # the last one out stops it
    c = deploy(deployments, register(deployments, "mv-c"))
    assert len(engines) == 2  # a new engine for the base
    assert deployments.find(c).engine_id not in (None, eid)


def test_other_tenants_full_fine_tunes_and_bases_get_engines_of_their_own(
    database: Engine, tmp_path: Path
) -> None:
    calls = Calls()
    deployments, engines = make_deployments(database, tmp_path, calls)
    ours = deploy(deployments, register(deployments, "mv-a"))
    theirs = deploy(deployments, register(deployments, "mv-t", tenant="globex"), "globex")
    whole = deploy(deployments, register(deployments, "mv-w", adapter=False))
    base = deploy(deployments, BASE_ID)
    assert len({deployments.find(d).endpoint_url for d in (ours, theirs, whole, base)}) == 4
    assert [e.spec.engine_id for e in engines[2:]] == [whole, base]  # own: the deployment's id
    assert engines[2].spec.base_dir is None  # transformers serve of the linked model
    assert engines[2].spec.pinned == f"ft:{BASE_ID}:x:mv-w"
    assert (engines[3].spec.base_name, engines[3].spec.serve_base) == (BASE_ID, True)
    assert calls.of("load") == []


def test_a_failed_warm_up_fails_the_deployment_and_takes_its_adapter_off(
    database: Engine, tmp_path: Path
) -> None:
    calls = Calls()
    deployments, engines = make_deployments(database, tmp_path, calls)
    kept = deploy(deployments, register(deployments, "mv-a"))
    engine: FakeEngine = engines[0]
    engine.fail_warm_up = True
    failing, _ = deployments.request("acme", register(deployments, "mv-b"))
    failed = deployments.launch(failing.id)
    assert (failed.status, failed.error) == ("failed", f"engine {engine.engine_id} answered "
                                                        f"500 for 'ft:{BASE_ID}:x:mv-b'")  # fmt: skip
    assert calls.made[-1] == ("unload", engine.engine_id, f"ft:{BASE_ID}:x:mv-b")
    assert deployments.find(kept).status == "ready"
    assert engine.alive()


def test_a_deployment_undeployed_before_its_launch_runs_starts_nothing(
    database: Engine, tmp_path: Path
) -> None:
    deployments, engines = make_deployments(database, tmp_path, Calls())
    deployment, _ = deployments.request("acme", register(deployments, "mv-a"))
    deployments.stop("acme", deployment.id)
    assert deployments.launch(deployment.id).status == "stopped"
    assert engines == []


def test_a_deployment_undeployed_while_its_engine_starts_stops_it_after(
    database: Engine, tmp_path: Path
) -> None:
    calls = Calls()
    deployments, engines = make_deployments(database, tmp_path, calls)
    deployment, _ = deployments.request("acme", register(deployments, "mv-a"))
    undeploy = threading.Thread(target=deployments.stop, args=("acme", deployment.id))

    def undeployed_meanwhile() -> None:  # DELETE arrives while the engine loads
        undeploy.start()
        while deployments.find(deployment.id).status != "stopped":
            time.sleep(0.01)

    def factory(spec: EngineSpec, pid: int | None) -> FakeEngine:
        engine = FakeEngine(spec, calls, pid)
        engine.on_start = undeployed_meanwhile
        engines.append(engine)
        return engine

    deployments.factory = factory
    assert deployments.launch(deployment.id).status == "stopped"  # never ready
    undeploy.join(10)
    assert [call[0] for call in calls.made] == ["start", "warm_up", "stop"]
    assert not engines[0].alive()
