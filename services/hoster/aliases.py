"""Aliases: a tenant's movable names (`production`, `candidate`, any name) for one version of an
`ft:` name, as MLflow's registry moved to instead of stages; `<ft: name>@<alias>` names that
version wherever a model is named (registry.resolve)."""

from __future__ import annotations

import re
from collections import defaultdict

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from services.hoster.errors import BadRequest, Conflict, NotFound
from services.hoster.models import ModelAlias, ModelVersion
from shared.db import utcnow
from shared.events import ModelAliasChanged

# Not a number: `<ft: name>@<n>` names version n.
ALIAS_PATTERN = re.compile(r"[a-z0-9_-]{1,64}")


def check_alias(alias: str) -> str:
    if ALIAS_PATTERN.fullmatch(alias) is None or alias.isdigit():
        raise BadRequest(
            f"alias: {alias!r} is not an alias: 1-64 lowercase letters, digits, '-' or '_', "
            "and not a number (`@<n>` names version n)",
            param="alias",
        )
    return alias


def find(session: Session, tenant: str, name: str, alias: str) -> ModelAlias | None:
    return session.get(ModelAlias, (tenant, name, alias))


def list_for(session: Session, tenant: str, name: str) -> list[tuple[ModelAlias, int]]:
    """The name's aliases with the version number each holds, by alias; 404 for a name with no
    version in this tenant's registry."""
    _check_name(session, tenant, name)
    rows = session.exec(
        select(ModelAlias, ModelVersion.version)
        .join(ModelVersion, col(ModelVersion.id) == col(ModelAlias.version_id))
        .where(ModelAlias.tenant == tenant, ModelAlias.name == name)
        .order_by(col(ModelAlias.alias))
    ).all()
    return [(alias, number) for alias, number in rows]


def by_name(session: Session, tenant: str) -> dict[str, dict[str, int]]:
    """Every alias of the tenant: ft: name -> {alias: version number}."""
    rows = session.exec(
        select(ModelAlias.name, ModelAlias.alias, ModelVersion.version)
        .join(ModelVersion, col(ModelVersion.id) == col(ModelAlias.version_id))
        .where(ModelAlias.tenant == tenant)
        .order_by(col(ModelAlias.alias))
    ).all()
    found: dict[str, dict[str, int]] = defaultdict(dict)
    for name, alias, number in rows:
        found[name][alias] = number
    return found


def holding(session: Session, tenant: str, version_id: str) -> list[str]:
    """The `<ft: name>@<alias>` names that hold a version."""
    rows = session.exec(
        select(ModelAlias)
        .where(ModelAlias.tenant == tenant, ModelAlias.version_id == version_id)
        .order_by(col(ModelAlias.alias))
    ).all()
    return [f"{row.name}@{row.alias}" for row in rows]


def set_alias(
    session: Session, tenant: str, name: str, alias: str, version: int | str
) -> tuple[ModelAlias, int, ModelAliasChanged | None]:
    """Point the alias at a version of `name` (its number, or its id `mv-…`), made or moved:
    the alias, the version number it holds, and the event to publish (None when it already
    held that version). An archived version is 409."""
    check_alias(alias)
    target = _target(session, tenant, name, version)
    number, row = target.version, find(session, tenant, name, alias)
    if row is not None and row.version_id == target.id:
        return row, number, None
    previous = session.get(ModelVersion, row.version_id) if row is not None else None
    changed = ModelAliasChanged(
        tenant=tenant,
        model_id=name,
        alias=alias,
        model_version=number,
        version_id=target.id,
        previous_version=previous.version if previous is not None else None,
    )
    if row is None:
        row = ModelAlias(tenant=tenant, name=name, alias=alias, version_id=target.id)
    else:
        row.version_id, row.updated_at = target.id, utcnow()
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # another request made the same alias a moment ago: move it instead
        session.rollback()
        return set_alias(session, tenant, name, alias, version)
    session.refresh(row)
    return row, number, changed


def remove_alias(session: Session, tenant: str, name: str, alias: str) -> ModelAliasChanged:
    """Remove the alias; the event saying so (`model_version` None)."""
    row = find(session, tenant, name, alias)
    if row is None:
        raise NotFound(f"alias: {name} has no alias {alias!r}", param="alias")
    held = session.get(ModelVersion, row.version_id)
    session.delete(row)
    session.commit()
    return ModelAliasChanged(
        tenant=tenant,
        model_id=name,
        alias=alias,
        previous_version=held.version if held is not None else None,
    )


def _check_name(session: Session, tenant: str, name: str) -> None:
    query = select(ModelVersion.id).where(ModelVersion.tenant == tenant, ModelVersion.name == name)
    if session.exec(query).first() is None:
        raise NotFound(f"model: no fine-tuned model {name!r} in this tenant's registry")


def _target(session: Session, tenant: str, name: str, version: int | str) -> ModelVersion:
    _check_name(session, tenant, name)
    query = select(ModelVersion).where(ModelVersion.tenant == tenant)
    if isinstance(version, int):
        found = session.exec(
            query.where(ModelVersion.name == name, ModelVersion.version == version)
        ).first()
    elif version.startswith("mv-"):
        found = session.exec(query.where(ModelVersion.id == version)).first()
    else:
        raise BadRequest(
            f"version: {version!r} is neither a version number nor a version id (mv-…)",
            param="version",
        )
    if found is None:
        raise NotFound(f"version: {name} has no version {version!r}", param="version")
    if found.name != name:
        raise BadRequest(
            f"version: {found.id} is a version of {found.name}, not of {name}", param="version"
        )
    if found.archived_at is not None:
        raise Conflict(
            f"version: {found.id} ({name} version {found.version}) is archived: an archived "
            "version is not aliased",
            version_id=found.id,
        )
    return found
