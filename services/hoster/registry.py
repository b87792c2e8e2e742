"""The model registry: catalogue base models and a tenant's fine-tuned versions with their lineage,
shown in OpenAI's model-object shape (plus vLLM's `parent` and `root`: the base a version was
tuned from, the checkpoint it is loaded from); which version a model name means; archive and
delete."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from services.hoster import aliases
from services.hoster.errors import BadRequest, Conflict, NotFound
from services.hoster.models import Deployment, ModelVersion, ServedName
from shared.catalogue import CATALOGUE
from shared.db import utcnow
from shared.events import EvalDecided, ModelRegistered

CATALOGUE_OWNER = "tuneloop"
# Bases are as old as the catalogue: a fixed date keeps the list stable across restarts.
CATALOGUE_CREATED = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())
# deployments.ACTIVE (which imports this module): an engine serves the version, will, or will
# again once woken (cold).
DEPLOYED = ("pending", "ready", "cold")


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


def serving(
    session: Session, tenant: str, name: str
) -> tuple[Deployment, ModelVersion | None] | None:
    """The deployment that answers served name `name` now (its primary) and the registry
    version it serves (None for a catalogue base); None when nothing does. For the evaluator,
    which compares a retrained version with it before it may become the name's canary."""
    row = session.get(ServedName, (tenant, name))
    primary = session.get(Deployment, row.primary_id) if row and row.primary_id else None
    if primary is None:
        return None
    version = session.get(ModelVersion, primary.version_id) if primary.version_id else None
    return primary, version


def resolve(
    session: Session, tenant: str, ref: str, *, field: str = "model", archived: bool = False
) -> ModelVersion:
    """The tenant's version `ref` names: a version id (`mv-…`), `<ft: name>@<alias>`,
    `<ft: name>@<n>` (version n), or an ft: name (its latest version not archived). An archived
    version is a 409 (it is not deployed anew) unless `archived` (reads: an ft: name whose
    versions are all archived then means its latest)."""
    found = _find(session, tenant, ref, field)
    if found.archived_at is not None and not archived:
        raise Conflict(
            f"{field}: {_describe(found)} is archived: it stays readable but is not deployed anew",
            version_id=found.id,
        )
    return found


def _find(session: Session, tenant: str, ref: str, field: str) -> ModelVersion:
    query = select(ModelVersion).where(ModelVersion.tenant == tenant)
    name, _, tag = ref.rpartition("@") if "@" in ref else (ref, "", "")
    if ref.startswith("mv-"):
        found = session.exec(query.where(ModelVersion.id == ref)).first()
    elif tag.isdigit():
        query = query.where(ModelVersion.name == name, ModelVersion.version == int(tag))
        found = session.exec(query).first()
    elif tag:
        alias = aliases.find(session, tenant, name, tag)
        if alias is None:
            raise NotFound(f"{field}: no alias {tag!r} of {name!r} in this tenant's registry")
        found = session.get(ModelVersion, alias.version_id)
    else:  # the latest version not archived, else the latest
        query = query.where(ModelVersion.name == ref).order_by(
            col(ModelVersion.archived_at).is_not(None), col(ModelVersion.version).desc()
        )
        found = session.exec(query).first()
    if found is None:
        raise NotFound(f"{field}: no fine-tuned model {ref!r} in this tenant's registry")
    return found


def archive(session: Session, tenant: str, version_id: str) -> ModelVersion:
    """Archive a version (once): kept and readable by id, left out of the list, neither deployed
    nor aliased anew; its running deployments go on. 409 while an alias holds it."""
    version = _by_id(session, tenant, version_id)
    if version.archived_at is not None:
        return version
    held = aliases.holding(session, tenant, version.id)
    if held:
        raise Conflict(
            f"model: {_describe(version)} is held by {', '.join(held)}: move or delete those "
            "aliases before archiving it",
            aliases=held,
        )
    version.archived_at = utcnow()
    session.add(version)
    session.commit()
    session.refresh(version)
    return version


def delete(session: Session, tenant: str, version_id: str) -> None:
    """Delete a version's record; 409 naming the active deployments and the aliases that hold it."""
    version = _by_id(session, tenant, version_id)
    deployed = session.exec(
        select(Deployment.id)
        .where(
            Deployment.tenant == tenant,
            Deployment.version_id == version.id,
            col(Deployment.status).in_(DEPLOYED),
        )
        .order_by(col(Deployment.id))
    ).all()
    held = aliases.holding(session, tenant, version.id)
    if deployed or held:
        holders = [f"deployment {d}" for d in deployed] + [f"alias {a}" for a in held]
        raise Conflict(
            f"model: {_describe(version)} is held by {', '.join(holders)}: undeploy it and move "
            "or delete those aliases before deleting it",
            deployments=list(deployed),
            aliases=held,
        )
    session.delete(version)
    try:
        session.commit()
    except IntegrityError:  # an alias was set on it meanwhile (the foreign key refuses)
        session.rollback()
        raise Conflict(f"model: {_describe(version)} was aliased meanwhile; try again") from None


def _by_id(session: Session, tenant: str, version_id: str) -> ModelVersion:
    if not version_id.startswith("mv-"):
        raise BadRequest(
            f"model: {version_id!r} is not a version id (mv-…): archive and delete take one, "
            "as an ft: name may have several versions",
            param="model",
        )
    return _find(session, tenant, version_id, "model")


def _describe(version: ModelVersion) -> str:
    return f"{version.id} ({version.name} version {version.version})"


def base_object(model_id: str) -> dict[str, Any]:
    entry = CATALOGUE[model_id]
    return {
        "id": entry.id,
        "object": "model",
        "created": CATALOGUE_CREATED,
        "owned_by": CATALOGUE_OWNER,
        "root": entry.id,  # what an engine loads: <data dir>/models/<id>
        "parent": None,
        "context_length": entry.context_length,
        "license": entry.license,
    }


def version_object(
    version: ModelVersion, aliases_of_name: dict[str, int] | None = None
) -> dict[str, Any]:
    """A version under its ft: name; `root` is the checkpoint an engine loads (as vLLM's `root`
    is the path a LoRA adapter was loaded from), `aliases` those of its name."""
    return {
        "id": version.name,
        "object": "model",
        "created": int(version.created_at.timestamp()),
        "owned_by": version.tenant,
        "root": version.checkpoint_uri,
        "parent": version.base_model,
        "version_id": version.id,
        "version": version.version,
        "aliases": aliases_of_name or {},
        "archived_at": int(version.archived_at.timestamp()) if version.archived_at else None,
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


def list_models(
    session: Session, tenant: str, *, include_archived: bool = False
) -> list[dict[str, Any]]:
    """Catalogue bases, then the tenant's fine-tuned names (the latest version not archived
    each), oldest first; with `include_archived`, then each archived version under its id."""
    versions = session.exec(
        select(ModelVersion)
        .where(ModelVersion.tenant == tenant)
        .order_by(col(ModelVersion.created_at), col(ModelVersion.version))
    ).all()
    latest: dict[str, ModelVersion] = {}
    archived: list[ModelVersion] = []
    for version in versions:
        if version.archived_at is None:
            latest[version.name] = version
        elif include_archived:
            archived.append(version)
    named = aliases.by_name(session, tenant)
    return (
        [base_object(i) for i in sorted(CATALOGUE)]
        + [version_object(v, named.get(v.name)) for v in latest.values()]
        + [version_object(v, named.get(v.name)) | {"id": v.id, "name": v.name} for v in archived]
    )


def get_model(session: Session, tenant: str, model_id: str) -> dict[str, Any]:
    """A base by catalogue id, or a version by any name `resolve` takes (archived ones too)."""
    if model_id in CATALOGUE:
        return base_object(model_id)
    version = resolve(session, tenant, model_id, archived=True)
    return version_object(version, aliases.by_name(session, tenant).get(version.name))
