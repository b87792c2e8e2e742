"""The model registry: catalogue base models and a tenant's fine-tuned versions with their lineage,
shown in OpenAI's model-object shape (plus `parent`, the base a version was tuned from)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from services.hoster.errors import NotFound
from services.hoster.models import ModelVersion
from shared.catalogue import CATALOGUE
from shared.events import EvalDecided, ModelRegistered

CATALOGUE_OWNER = "tuneloop"
# Bases are as old as the catalogue: a fixed date keeps the list stable across restarts.
CATALOGUE_CREATED = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())


def register(session: Session, event: EvalDecided, *, sha256: str) -> tuple[ModelVersion, bool]:
    """The version for the job's decision, and whether this call created it (False when a
    redelivered decision finds it already registered)."""
    existing = _by_job(session, event.tenant, event.job_id)
    if existing is not None:
        return existing, False
    latest = session.exec(
        select(func.max(ModelVersion.version)).where(
            ModelVersion.tenant == event.tenant, ModelVersion.name == event.fine_tuned_model
        )
    ).one()
    version = ModelVersion(
        id=f"mv-{uuid.uuid4().hex[:20]}",
        tenant=event.tenant,
        name=event.fine_tuned_model,
        version=(latest or 0) + 1,
        base_model=event.base_model,
        job_id=event.job_id,
        dataset_id=event.dataset_id,
        dataset_version=event.dataset_version,
        step=event.best_step,
        checkpoint_uri=event.best_checkpoint_uri,
        sha256=sha256,
        best_score=event.best_score,
        base_score=event.base_score,
        scores={str(step): score for step, score in sorted(event.scores.items())},
        gate=event.gate,
        gate_reason=event.gate_reason,
    )
    session.add(version)
    try:
        session.commit()
    except IntegrityError:  # another instance registered the same job a moment ago
        session.rollback()
        raced = _by_job(session, event.tenant, event.job_id)
        if raced is None:
            raise
        return raced, False
    session.refresh(version)
    return version, True


def _by_job(session: Session, tenant: str, job_id: str) -> ModelVersion | None:
    query = select(ModelVersion).where(ModelVersion.tenant == tenant, ModelVersion.job_id == job_id)
    return session.exec(query).first()


def registered_event(version: ModelVersion) -> ModelRegistered:
    """ModelRegistered for a version; its event id is the version's, so a republished one is
    stored once (JetStream's duplicate window) and consumers can tell repeats apart."""
    scores = {"task_score": version.best_score, "base_score": version.base_score}
    return ModelRegistered(
        event_id=f"model-registered-{version.id}",
        tenant=version.tenant,
        model_id=version.name,
        model_version=version.version,
        version_id=version.id,
        artifact_uri=version.checkpoint_uri,
        sha256=version.sha256,
        base_model=version.base_model,
        job_id=version.job_id,
        dataset_id=version.dataset_id,
        dataset_version=version.dataset_version,
        step=version.step,
        scores={k: v for k, v in scores.items() if v is not None},
        gate=version.gate,
    )


def resolve(session: Session, tenant: str, ref: str, *, field: str = "model") -> ModelVersion:
    """The tenant's version named by ref: a version id, or an ft: name (its latest version)."""
    query = select(ModelVersion).where(ModelVersion.tenant == tenant)
    if ref.startswith("mv-"):
        found = session.exec(query.where(ModelVersion.id == ref)).first()
    else:
        query = query.where(ModelVersion.name == ref).order_by(col(ModelVersion.version).desc())
        found = session.exec(query).first()
    if found is None:
        raise NotFound(f"{field}: no fine-tuned model {ref!r} in this tenant's registry")
    return found


def base_object(model_id: str) -> dict[str, Any]:
    entry = CATALOGUE[model_id]
    return {
        "id": entry.id,
        "object": "model",
        "created": CATALOGUE_CREATED,
        "owned_by": CATALOGUE_OWNER,
        "parent": None,
        "context_length": entry.context_length,
        "license": entry.license,
    }


def version_object(version: ModelVersion) -> dict[str, Any]:
    return {
        "id": version.name,
        "object": "model",
        "created": int(version.created_at.timestamp()),
        "owned_by": version.tenant,
        "parent": version.base_model,
        "version_id": version.id,
        "version": version.version,
        "job_id": version.job_id,
        "dataset_id": version.dataset_id,
        "dataset_version": version.dataset_version,
        "step": version.step,
        "checkpoint_uri": version.checkpoint_uri,
        "sha256": version.sha256,
        "task_score": version.best_score,
        "base_score": version.base_score,
        "scores": version.scores,
        "gate": version.gate,
        "gate_reason": version.gate_reason,
    }


def list_models(session: Session, tenant: str) -> list[dict[str, Any]]:
    """Catalogue bases, then the tenant's fine-tuned names (latest version each), oldest first."""
    versions = session.exec(
        select(ModelVersion)
        .where(ModelVersion.tenant == tenant)
        .order_by(col(ModelVersion.created_at), col(ModelVersion.version))
    ).all()
    latest: dict[str, ModelVersion] = {}
    for version in versions:
        latest[version.name] = version
    return [base_object(i) for i in sorted(CATALOGUE)] + [
        version_object(v) for v in latest.values()
    ]


def get_model(session: Session, tenant: str, model_id: str) -> dict[str, Any]:
    if model_id in CATALOGUE:
        return base_object(model_id)
    try:
        return version_object(resolve(session, tenant, model_id))
    except NotFound:
        raise NotFound(f"model {model_id!r} not found") from None
