"""eval.decided -> the registry, on real S3 and a real database: the digest is the checkpoint's
commit marker, a redelivered decision registers nothing twice, a checkpoint that was never
committed is a permanent failure (dead-lettered, not retried forever), and a rejected version
with auto_deploy is not deployed."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.eval_engines import EvalEngines
from services.hoster.models import Deployment, ModelVersion
from services.hoster.served_names import ServedNames
from services.hoster.state import Hoster
from shared import bus
from shared.events import EvalDecided, Event, ModelRegistered
from shared.settings import S3Settings
from shared.storage import COMMIT_MARKER, ObjectStore, StorageError
from tests.plugins.infra import free_port
from tests.services.hoster.checkpoints import BASE_ID, store_checkpoint


def no_engine(*_: object) -> object:
    raise AssertionError("no engine may start here")


@pytest.fixture
def hoster_parts(
    db_engine: Engine, object_store: ObjectStore, tmp_path: Path
) -> tuple[Hoster, list[Event]]:
    published: list[Event] = []

    async def publish(event: Event) -> None:
        published.append(event)

    settings = HosterSettings(work_dir=tmp_path / "hoster")
    common = {"settings": settings, "data_dir": tmp_path, "store": object_store}
    hoster = Hoster(
        settings,
        tmp_path,
        object_store,
        db_engine,
        publish,
        EvalEngines(**common, factory=no_engine),  # type: ignore[arg-type]
        Deployments(**common, database=db_engine, factory=no_engine),  # type: ignore[arg-type]
        ServedNames(db_engine),
    )
    return hoster, published


def decision(uri: str, **overrides: object) -> EvalDecided:
    values: dict[str, object] = {
        "tenant": "acme",
        "job_id": "ftjob-reg",
        "base_model": BASE_ID,
        "fine_tuned_model": f"ft:{BASE_ID}:x:ftjob-reg",
        "dataset_id": "ds",
        "dataset_version": "v",
        "best_step": 3,
        "best_checkpoint_uri": uri,
        "gate": "passed",
    }
    return EvalDecided.model_validate(values | overrides)


async def test_a_decision_registers_once_with_the_checkpoints_digest(
    hoster_parts: tuple[Hoster, list[Event]], object_store: ObjectStore, tmp_path: Path
) -> None:
    hoster, published = hoster_parts
    uri = store_checkpoint(object_store, tmp_path, tenant="acme", job_id="ftjob-reg", step=3)
    await hoster.register(decision(uri))
    await hoster.register(decision(uri, event_id="redelivered-with-a-new-id"))
    with Session(hoster.database) as session:
        versions = session.exec(select(ModelVersion)).all()
    assert len(versions) == 1
    assert versions[0].sha256 == object_store.get_bytes(f"{uri}/{COMMIT_MARKER}").decode()
    assert [type(e) for e in published] == [ModelRegistered, ModelRegistered]
    assert published[0].event_id == published[1].event_id  # stored once on the bus


async def test_a_checkpoint_never_committed_is_a_permanent_failure(
    hoster_parts: tuple[Hoster, list[Event]], object_store: ObjectStore
) -> None:
    hoster, published = hoster_parts
    uri = object_store.uri("tenants/acme/jobs/ftjob-reg/checkpoints/step-00000003")
    object_store.put_bytes(f"{uri}/model/adapter_config.json", b"{}")  # no commit marker
    with pytest.raises(bus.PermanentError, match="not committed"):
        await hoster.register(decision(uri))
    assert not published


async def test_a_rejected_version_is_not_auto_deployed(
    hoster_parts: tuple[Hoster, list[Event]], object_store: ObjectStore, tmp_path: Path
) -> None:
    hoster, published = hoster_parts
    uri = store_checkpoint(object_store, tmp_path, tenant="acme", job_id="ftjob-reg", step=3)
    await hoster.register(decision(uri, gate="rejected", auto_deploy=True))
    with Session(hoster.database) as session:
        assert not session.exec(select(Deployment)).all()
    assert [type(e) for e in published] == [ModelRegistered]


async def test_an_unreachable_store_is_retried_not_dead_lettered(
    hoster_parts: tuple[Hoster, list[Event]],
) -> None:
    hoster, published = hoster_parts
    hoster.store = ObjectStore.from_settings(S3Settings(port=free_port()))  # nothing listens
    with pytest.raises(StorageError) as raised:
        await hoster.register(decision("s3://tuneloop-test/tenants/acme/jobs/j/checkpoints/step-1"))
    assert not isinstance(raised.value, bus.PermanentError)
    assert not published
