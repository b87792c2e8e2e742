"""The hoster's request and response bodies (OpenAI's model objects, deployments, served names,
aliases, the internal eval-engine API), declared once for api.py's routes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.hoster.models import Deployment, ModelAlias, ServedName
from services.hoster.served_names import NAME_PATTERN, Role, current_score
from shared.events import CanaryPolicy, PairwiseScore
from shared.tenancy import TenantId


class ModelObject(BaseModel):
    """OpenAI's model object, plus vLLM's `parent` (the base a version was tuned from) and `root`
    (what an engine loads: a version's checkpoint URI, a base's catalogue id), and lineage."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str | None = None
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class ModelDeleted(BaseModel):
    """OpenAI's answer to deleting a model; here one version, by its id."""

    id: str
    object: Literal["model"] = "model"
    deleted: bool = True


class AliasSet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Annotated[int, Field(ge=1)] | Annotated[str, Field(min_length=1, max_length=64)] = (
        Field(description="a version number of the ft: name, or a version id (mv-…)")
    )


class AliasObject(BaseModel):
    object: Literal["model.alias"] = "model.alias"
    model: str = Field(description="the ft: name; `<model>@<alias>` names the version")
    alias: str
    version: int
    version_id: str
    updated_at: int

    @classmethod
    def of(cls, row: ModelAlias, version: int) -> AliasObject:
        return cls(
            model=row.name,
            alias=row.alias,
            version=version,
            version_id=row.version_id,
            updated_at=int(row.updated_at.timestamp()),
        )


class AliasList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AliasObject]


class AliasDeleted(BaseModel):
    object: Literal["model.alias"] = "model.alias"
    model: str
    alias: str
    deleted: bool = True


class DeploymentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(
        min_length=1, max_length=256, description="an ft: name, a version id or a catalogue base id"
    )
    served_name: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="a stable name callers use; once ready this deployment answers it (the one "
        "it replaces is kept as the rollback target), or with canary_percent a share of it",
    )
    canary_percent: float | None = Field(
        default=None, gt=0, le=100, description="deploy as the served name's canary"
    )
    shadow_percent: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="deploy as the served name's shadow: this share of its calls mirrored to it",
    )
    rollback: CanaryPolicy | None = Field(
        default=None, description="when a canary is rolled back by itself"
    )
    pinned: bool | None = Field(
        default=None,
        description="true: never unloaded for idling; false: unloaded (cold) after "
        "TUNELOOP_HOSTER_IDLE_UNLOAD_S without calls and woken by the next; unset: as it is "
        "(false for a new deployment)",
    )

    @model_validator(mode="after")
    def _canary_needs_a_name(self) -> DeploymentCreate:
        if self.canary_percent is not None and self.shadow_percent is not None:
            raise ValueError("canary_percent, shadow_percent: a deployment is one or the other")
        for field, value in (("canary_percent", self.canary_percent),
                             ("shadow_percent", self.shadow_percent)):  # fmt: skip
            if value is not None and self.served_name is None:
                raise ValueError(f"{field}: it shares a served_name: give one")
        return self

    def role(self) -> Role:
        if self.canary_percent is not None:
            return "canary"
        return "shadow" if self.shadow_percent is not None else "primary"


class ServedNameUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    canary_percent: float | None = Field(default=None, ge=0, le=100)
    shadow_percent: float | None = Field(default=None, ge=0, le=100)
    rollback: CanaryPolicy | None = None


class ServedNameObject(BaseModel):
    name: str
    object: Literal["served_name"] = "served_name"
    primary: str | None = Field(description="the deployment answering it")
    canary: str | None = Field(description="the deployment taking canary_percent of its calls")
    canary_percent: float
    shadow: str | None = Field(description="the deployment mirrored shadow_percent of its calls")
    shadow_percent: float
    previous: str | None = Field(description="what a rollback without a canary goes back to")
    rollback: CanaryPolicy
    shadow_score: PairwiseScore | None = Field(
        default=None,
        description="the evaluator's latest pairwise score of the shadow against the primary",
    )
    revision: int
    updated_at: int

    @classmethod
    def of(cls, row: ServedName) -> ServedNameObject:
        return cls(
            name=row.name,
            primary=row.primary_id,
            canary=row.canary_id,
            canary_percent=row.canary_percent,
            shadow=row.shadow_id,
            shadow_percent=row.shadow_percent,
            previous=row.previous_id,
            rollback=CanaryPolicy.model_validate(row.policy or {}),
            shadow_score=current_score(row),
            revision=row.revision,
            updated_at=int(row.updated_at.timestamp()),
        )


class PromoteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    force: bool = Field(
        default=False, description="promote a shadow its pairwise score does not call better"
    )


class ServedNameList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ServedNameObject]


class DeploymentObject(BaseModel):
    id: str
    object: Literal["deployment"] = "deployment"
    model: str = Field(description="the name the engine answers to (ft: name or catalogue id)")
    version_id: str | None = Field(description="the registry version served; null for a base")
    status: Literal["pending", "ready", "cold", "failed", "stopped"]
    pinned: bool = Field(default=False, description="never unloaded for idling")
    served_name: str | None = None
    role: Role | None = None
    endpoint_url: str | None
    error: str | None
    created_at: int
    updated_at: int

    @classmethod
    def of(cls, row: Deployment) -> DeploymentObject:
        return cls(
            id=row.id,
            model=row.served_model_name,
            version_id=row.version_id,
            status=row.status,
            pinned=row.pinned,
            served_name=row.served_name,
            role=row.role,
            endpoint_url=row.endpoint_url,
            error=row.error,
            created_at=int(row.created_at.timestamp()),
            updated_at=int(row.updated_at.timestamp()),
        )


class DeploymentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeploymentObject]


class EngineCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: TenantId
    job_id: str = Field(min_length=1, max_length=128)
    base_model: str = Field(min_length=1, max_length=128, description="a catalogue id")


class EngineInfo(BaseModel):
    engine_id: str
    base_url: str
    base_model_name: str


class CheckpointLoad(BaseModel):
    model_config = ConfigDict(extra="forbid")
    uri: str = Field(min_length=1, max_length=1024)
    step: int = Field(ge=0)
    # A registered version's checkpoint (the serving one the evaluator compares a job with):
    # loaded under the version's id instead of a step of the job.
    version_id: str | None = Field(default=None, pattern=r"^mv-[a-z0-9]{1,60}$")


class CheckpointModel(BaseModel):
    model: str


class ServingVersion(BaseModel):
    """What answers a served name now (its primary): the evaluator scores it beside a retrained
    version of the name before that version may become its canary."""

    deployment_id: str
    version_id: str | None = Field(description="the registry version; null for a catalogue base")
    version: int | None = Field(description="its number under its ft: name")
    model: str = Field(description="the name its engine answers to (ft: name or catalogue id)")
    base_model: str | None = Field(description="the catalogue base it was tuned from")
    checkpoint_uri: str | None = Field(
        description="the checkpoint it was registered from, which an eval engine loads"
    )


class ServedNow(BaseModel):
    name: str
    primary: ServingVersion | None = Field(description="null: nothing serves the name")
