"""Tables owned by the hoster service (sqlmodel): model versions with their lineage, and
deployments. Migration: shared/migrations/versions/*_hoster_model_versions_and_deployments.py."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import UniqueConstraint
from sqlmodel import Field, SQLModel

from shared.db import UTCDateTime, utcnow


class ModelVersion(SQLModel, table=True):
    """A fine-tuned checkpoint registered as a servable version of its `ft:` name."""

    __tablename__ = "hoster_model_versions"
    # One version per job: a redelivered decision registers nothing twice.
    __table_args__ = (
        UniqueConstraint("tenant", "job_id", name="uq_hoster_model_versions_job"),
        UniqueConstraint("tenant", "name", "version", name="uq_hoster_model_versions_name"),
    )

    id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(index=True, max_length=64)
    name: str = Field(index=True, max_length=256, description="the ft: name it is served under")
    version: int = Field(ge=1)
    base_model: str = Field(max_length=128)
    job_id: str = Field(max_length=128)
    dataset_id: str = Field(max_length=128)
    dataset_version: str = Field(max_length=128)
    step: int = Field(ge=0)
    checkpoint_uri: str = Field(max_length=1024)
    sha256: str = Field(max_length=64)
    best_score: float | None = None
    base_score: float | None = None
    scores: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    gate: str | None = Field(default=None, max_length=16)
    gate_reason: str = Field(default="", max_length=1024)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Set: kept and readable, no longer listed by default, deployed or aliased anew.
    archived_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Deployment(SQLModel, table=True):
    """A version (or a catalogue base: `version_id` None, served under its catalogue id) served
    by an engine: the desired state (pending/ready) survives restarts."""

    __tablename__ = "hoster_deployments"

    id: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(index=True, max_length=64)
    version_id: str | None = Field(default=None, index=True, max_length=64)
    served_model_name: str = Field(max_length=256)
    # pending | ready | cold (unloaded after idling; woken by the next call) | failed | stopped
    status: str = Field(max_length=16)
    endpoint_url: str | None = Field(default=None, max_length=512)
    port: int | None = None
    pid: int | None = None
    # The engine serving it: a tenant's LoRA versions of one base share one (`eng-…`); a full
    # fine-tune or a catalogue base has its own (its deployment's id).
    engine_id: str | None = Field(default=None, max_length=64)
    # Never unloaded for idling (kept hot).
    pinned: bool = False
    error: str | None = Field(default=None, max_length=4096)
    # The stable name it was deployed under (served_names.py) and what it becomes there once
    # ready: "primary" (a switch) or "canary"; None: served under its own name only.
    served_name: str | None = Field(default=None, max_length=256)
    role: str | None = Field(default=None, max_length=16)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ServedName(SQLModel, table=True):
    """A stable name a tenant's callers use (served_names.py): the deployment that answers it
    (`primary_id`), a candidate taking `canary_percent` of its calls (`canary_id`), the one it
    replaced last (`previous_id`, what a rollback goes back to) and the automatic-rollback
    policy. `revision` grows with every change: the gateway keeps the newest it has seen."""

    __tablename__ = "hoster_served_names"

    tenant: str = Field(primary_key=True, max_length=64)
    name: str = Field(primary_key=True, max_length=256)
    primary_id: str | None = Field(default=None, max_length=64)
    canary_id: str | None = Field(default=None, max_length=64)
    canary_percent: float = 0.0
    # A candidate mirrored `shadow_percent` of the calls: its answers are kept, never returned.
    shadow_id: str | None = Field(default=None, max_length=64)
    shadow_percent: float = 0.0
    # The evaluator's latest pairwise score of the shadow against the primary (eval.shadow_scored,
    # as JSON): promote reads it; it holds for the versions it names only.
    shadow_score: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    previous_id: str | None = Field(default=None, max_length=64)
    policy: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    revision: int = 0
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ModelAlias(SQLModel, table=True):
    """A movable name (`production`, `candidate`, ...) for one version of a tenant's `ft:` name:
    `<ft: name>@<alias>` names that version wherever a model is named (aliases.py)."""

    __tablename__ = "hoster_model_aliases"

    tenant: str = Field(primary_key=True, max_length=64)
    name: str = Field(primary_key=True, max_length=256, description="the ft: name")
    alias: str = Field(primary_key=True, max_length=64)
    # No ondelete: a version an alias holds cannot be deleted.
    version_id: str = Field(foreign_key="hoster_model_versions.id", index=True, max_length=64)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
