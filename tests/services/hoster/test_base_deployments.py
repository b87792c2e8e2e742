"""Deploying a catalogue base (the request path): served under its catalogue id with no version,
one active deployment per tenant and base, refused with a 4xx naming `model` when the base is not
prepared on this machine. The engine side runs in test_hoster_service.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.errors import BadRequest, NotFound
from shared.settings import S3Settings
from shared.storage import ObjectStore
from tests.services.hoster.checkpoints import BASE_ID, install_base


def deployments(database: Engine, data_dir: Path) -> Deployments:
    return Deployments(
        settings=HosterSettings(work_dir=data_dir / "hoster"),
        data_dir=data_dir,
        store=ObjectStore.from_settings(S3Settings()),
        database=database,
        factory=lambda spec, pid: pytest.fail("requests start no engine"),
    )


def test_a_base_is_deployed_under_its_catalogue_id_once_per_tenant(
    db_engine: Engine, tmp_path: Path, tiny_model_dir: Path
) -> None:
    install_base(tmp_path, tiny_model_dir)
    hoster = deployments(db_engine, tmp_path)
    first, new = hoster.request("acme", BASE_ID)
    assert new
    assert (first.served_model_name, first.version_id, first.status) == (BASE_ID, None, "pending")
    again, new = hoster.request("acme", BASE_ID)
    assert (again.id, new) == (first.id, False)  # an active deployment of the base is reused
    theirs, new = hoster.request("globex", BASE_ID)
    assert new
    assert theirs.id != first.id  # each tenant's own engine
    assert [d.id for d in hoster.list_for("acme")] == [first.id]

    hoster.stop("acme", first.id)
    after, new = hoster.request("acme", BASE_ID)
    assert new
    assert after.id != first.id
    with pytest.raises(NotFound, match="no fine-tuned model 'smollm2-135m-instruct'"):
        hoster.request("acme", BASE_ID.lower())  # catalogue ids are exact


def test_a_base_not_prepared_here_is_refused_naming_the_field(
    db_engine: Engine, tmp_path: Path
) -> None:
    with pytest.raises(BadRequest, match=rf"^model: {BASE_ID} is not prepared") as raised:
        deployments(db_engine, tmp_path).request("acme", BASE_ID)
    assert raised.value.status == 422
