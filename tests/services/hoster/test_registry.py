"""The registry: versions from eval decisions (once per job), OpenAI's model list with `parent`,
lookups by ft: name and version id, and the gate's 409 when deploying a rejected version."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from services.hoster import registry
from services.hoster.config import HosterSettings
from services.hoster.deployments import Deployments
from services.hoster.errors import Conflict, NotFound
from shared.events import EvalDecided
from shared.settings import S3Settings
from shared.storage import ObjectStore

FT = "ft:SmolLM2-135M-Instruct:tickets:ftjob-abc"
SHA = "a" * 64


def decision(**overrides: object) -> EvalDecided:
    values: dict[str, object] = {
        "tenant": "acme",
        "job_id": "ftjob-abc",
        "base_model": "SmolLM2-135M-Instruct",
        "fine_tuned_model": FT,
        "dataset_id": "ds-1",
        "dataset_version": "v1",
        "best_step": 40,
        "best_checkpoint_uri": "s3://b/tenants/acme/jobs/ftjob-abc/checkpoints/step-00000040",
        "best_score": 0.9,
        "base_score": 0.4,
        "scores": {20: 0.7, 40: 0.9},
        "gate": "passed",
        "gate_reason": "0.90 >= 0.80 and beats base 0.40 by 0.50",
    }
    return EvalDecided.model_validate(values | overrides)


def test_a_decision_registers_one_version_with_its_lineage(db_session: Session) -> None:
    version, created = registry.register(db_session, decision(), sha256=SHA)
    assert created
    assert version.version == 1
    assert version.id.startswith("mv-")
    assert (version.name, version.step, version.sha256) == (FT, 40, SHA)
    assert (version.dataset_id, version.dataset_version, version.base_model) == (
        "ds-1",
        "v1",
        "SmolLM2-135M-Instruct",
    )
    assert version.scores == {"20": 0.7, "40": 0.9}

    again, created = registry.register(db_session, decision(event_id="another"), sha256=SHA)
    assert not created
    assert again.id == version.id
    event = registry.registered_event(again)
    assert (event.model_id, event.version_id, event.step, event.gate) == (
        FT,
        version.id,
        40,
        "passed",
    )
    assert event.scores == {"task_score": 0.9, "base_score": 0.4}
    assert (
        event.event_id == registry.registered_event(version).event_id
    )  # republished: deduplicated


def test_models_list_bases_and_the_tenants_versions(db_session: Session) -> None:
    registry.register(db_session, decision(), sha256=SHA)
    registry.register(db_session, decision(tenant="globex", job_id="ftjob-g"), sha256=SHA)
    models = registry.list_models(db_session, "acme")
    assert [m["id"] for m in models] == ["SmolLM2-135M-Instruct", FT]
    base, tuned = models
    assert base["object"] == "model"
    assert base["parent"] is None
    assert base["owned_by"] == "tuneloop"
    assert tuned["parent"] == "SmolLM2-135M-Instruct"
    assert tuned["owned_by"] == "acme"
    assert isinstance(tuned["created"], int)
    assert tuned["task_score"] == 0.9

    by_name = registry.get_model(db_session, "acme", FT)
    assert registry.get_model(db_session, "acme", by_name["version_id"])["id"] == FT
    with pytest.raises(NotFound, match="ft:nope:x:y"):
        registry.get_model(db_session, "acme", "ft:nope:x:y")
    assert len(registry.list_models(db_session, "initech")) == 1  # bases only


def test_deploying_a_rejected_version_is_a_conflict_with_its_numbers(
    db_engine: Engine, tmp_path: Path
) -> None:
    with Session(db_engine) as session:
        registry.register(
            session,
            decision(gate="rejected", best_score=0.5, gate_reason="0.50 < 0.80"),
            sha256=SHA,
        )
    deployments = Deployments(
        settings=HosterSettings(work_dir=tmp_path),
        data_dir=tmp_path,
        store=ObjectStore.from_settings(S3Settings()),
        database=db_engine,
        factory=lambda spec, pid: pytest.fail("no engine may start"),
    )
    with pytest.raises(Conflict, match=r"rejected by the eval gate: 0\.50 < 0\.80") as raised:
        deployments.request("acme", FT)
    assert raised.value.details | {"task_score": 0.5, "base_score": 0.4, "gate": "rejected"} == (
        raised.value.details
    )
    with pytest.raises(NotFound, match="model: no fine-tuned model"):
        deployments.request("globex", FT)
