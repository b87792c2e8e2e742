"""HTTP routes of the hoster service: the model registry (`/v1/models`), deployments
(`/v1/deployments`), served names and their canaries (`/v1/served_names`), and the internal eval-engine API the evaluator calls (`/internal/engines`,
service token only, never routed by the gateway) with the gateway's wake of a cold deployment
(`/internal/deployments/{id}/wake`), and what serves a tenant's served name
(`/internal/tenants/{tenant}/served_names/{name}`: the evaluator's, before a retrained version
may become its canary)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import JSONResponse
from sqlmodel import Session

from services.hoster import aliases, registry
from services.hoster.errors import HosterError
from services.hoster.schemas import (
    AliasDeleted,
    AliasList,
    AliasObject,
    AliasSet,
    CheckpointLoad,
    CheckpointModel,
    DeploymentCreate,
    DeploymentList,
    DeploymentObject,
    EngineCreate,
    EngineInfo,
    ModelDeleted,
    ModelList,
    ModelObject,
    PromoteBody,
    ServedNameList,
    ServedNameObject,
    ServedNameUpdate,
    ServedNow,
    ServingVersion,
)
from services.hoster.state import Hoster
from shared import auth
from shared.db import get_session
from shared.tenancy import TENANT_PATTERN

_ERROR_TYPES = {404: "invalid_request_error", 409: "conflict", 422: "invalid_request_error"}


async def hoster_error(request: Request, exc: Exception) -> JSONResponse:
    """Every domain error, mapped once: its status, its message as `detail` and as OpenAI's
    `error.message` (so the SDK shows it), its numbers beside it."""
    assert isinstance(exc, HosterError)
    error = {"message": exc.message, "type": _ERROR_TYPES.get(exc.status, "api_error")}
    return JSONResponse({"detail": exc.message, "error": error | exc.details}, exc.status)


def get_hoster(request: Request) -> Hoster:
    hoster: Hoster = request.app.state.hoster
    return hoster


HosterDep = Annotated[Hoster, Depends(get_hoster)]
SessionDep = Annotated[Session, Depends(get_session)]
TenantDep = Annotated[auth.Principal, Depends(auth.require_access)]


# --- tenant routes ------------------------------------------------------------------------------

v1 = APIRouter(prefix="/v1", dependencies=[Depends(auth.require_access)])


@v1.get("/models", response_model=ModelList, tags=["models"], summary="Base and fine-tuned models")
def list_models(
    principal: TenantDep, session: SessionDep, include_archived: bool = False
) -> dict[str, Any]:
    found = registry.list_models(session, principal.tenant_id, include_archived=include_archived)
    return {"object": "list", "data": found}


@v1.get("/models/{model_id}", response_model=ModelObject, tags=["models"], summary="One model")
def get_model(model_id: str, principal: TenantDep, session: SessionDep) -> dict[str, Any]:
    return registry.get_model(session, principal.tenant_id, model_id)


@v1.delete("/models/{model_id}", response_model=ModelDeleted, tags=["models"],
           summary="Delete a version (by id) no active deployment or alias holds")  # fmt: skip
def delete_model(model_id: str, principal: TenantDep, session: SessionDep) -> ModelDeleted:
    registry.delete(session, principal.tenant_id, model_id)
    return ModelDeleted(id=model_id)


@v1.post("/models/{model_id}/archive", response_model=ModelObject, tags=["models"],
         summary="Archive a version (by id): kept, readable, not listed, deployed or aliased anew")  # fmt: skip
def archive_model(model_id: str, principal: TenantDep, session: SessionDep) -> dict[str, Any]:
    registry.archive(session, principal.tenant_id, model_id)
    return registry.get_model(session, principal.tenant_id, model_id)


@v1.get("/models/{name}/aliases", response_model=AliasList, tags=["models"],
        summary="An ft: name's aliases")  # fmt: skip
def list_aliases(name: str, principal: TenantDep, session: SessionDep) -> AliasList:
    found = aliases.list_for(session, principal.tenant_id, name)
    return AliasList(data=[AliasObject.of(row, version) for row, version in found])


@v1.put("/models/{name}/aliases/{alias}", response_model=AliasObject, tags=["models"],
        summary="Point an alias at a version of an ft: name (made or moved)")  # fmt: skip
async def set_alias(
    name: str, alias: str, body: AliasSet, principal: TenantDep, session: SessionDep,
    hoster: HosterDep,
) -> AliasObject:  # fmt: skip
    row, version, changed = await asyncio.to_thread(
        aliases.set_alias, session, principal.tenant_id, name, alias, body.version
    )
    if changed is not None:
        await hoster.publish(changed)
    return AliasObject.of(row, version)


@v1.delete("/models/{name}/aliases/{alias}", response_model=AliasDeleted, tags=["models"])
async def delete_alias(
    name: str, alias: str, principal: TenantDep, session: SessionDep, hoster: HosterDep
) -> AliasDeleted:
    removed = await asyncio.to_thread(
        aliases.remove_alias, session, principal.tenant_id, name, alias
    )
    await hoster.publish(removed)
    return AliasDeleted(model=name, alias=alias)


@v1.post("/deployments", response_model=DeploymentObject, tags=["deployments"],
         summary="Deploy a fine-tuned version or a catalogue base (pending until it has answered once)")  # fmt: skip
async def create_deployment(
    body: DeploymentCreate, principal: TenantDep, hoster: HosterDep
) -> DeploymentObject:
    row = await hoster.deploy(
        principal.tenant_id,
        body.model,
        served_name=body.served_name,
        role=body.role(),
        percent=body.canary_percent if body.canary_percent is not None else body.shadow_percent,
        policy=body.rollback,
        pinned=body.pinned,
    )
    return DeploymentObject.of(row)


@v1.get("/deployments", response_model=DeploymentList, tags=["deployments"])
async def list_deployments(principal: TenantDep, hoster: HosterDep) -> DeploymentList:
    rows = await asyncio.to_thread(hoster.deployments.list_for, principal.tenant_id)
    return DeploymentList(data=[DeploymentObject.of(row) for row in rows])


@v1.get("/deployments/{deployment_id}", response_model=DeploymentObject, tags=["deployments"])
async def get_deployment(
    deployment_id: str, principal: TenantDep, hoster: HosterDep
) -> DeploymentObject:
    row = await asyncio.to_thread(hoster.deployments.get, principal.tenant_id, deployment_id)
    return DeploymentObject.of(row)


@v1.delete("/deployments/{deployment_id}", response_model=DeploymentObject, tags=["deployments"],
           summary="Stop a deployment's engine")  # fmt: skip
async def delete_deployment(
    deployment_id: str, principal: TenantDep, hoster: HosterDep
) -> DeploymentObject:
    return DeploymentObject.of(await hoster.undeploy(principal.tenant_id, deployment_id))


async def _served(hoster: Hoster, tenant: str, name: str) -> ServedNameObject:
    return ServedNameObject.of(await asyncio.to_thread(hoster.served.get, tenant, name))


@v1.get("/served_names", response_model=ServedNameList, tags=["deployments"])
async def list_served_names(principal: TenantDep, hoster: HosterDep) -> ServedNameList:
    rows = await asyncio.to_thread(hoster.served.list_for, principal.tenant_id)
    return ServedNameList(data=[ServedNameObject.of(row) for row in rows])


@v1.get("/served_names/{name}", response_model=ServedNameObject, tags=["deployments"])
async def get_served_name(name: str, principal: TenantDep, hoster: HosterDep) -> ServedNameObject:
    return await _served(hoster, principal.tenant_id, name)


@v1.post("/served_names/{name}", response_model=ServedNameObject, tags=["deployments"],
         summary="Change a served name's canary share or rollback policy")  # fmt: skip
async def update_served_name(
    name: str, body: ServedNameUpdate, principal: TenantDep, hoster: HosterDep
) -> ServedNameObject:
    await hoster.set_canary(
        principal.tenant_id, name, body.canary_percent, body.rollback, body.shadow_percent
    )
    return await _served(hoster, principal.tenant_id, name)


@v1.post("/served_names/{name}/promote", response_model=ServedNameObject, tags=["deployments"],
         summary="The canary (else a shadow scored better, or forced) becomes the primary")  # fmt: skip
async def promote_served_name(
    name: str, principal: TenantDep, hoster: HosterDep, body: PromoteBody | None = None
) -> ServedNameObject:
    await hoster.promote(principal.tenant_id, name, force=body is not None and body.force)
    return await _served(hoster, principal.tenant_id, name)


@v1.post("/served_names/{name}/rollback", response_model=ServedNameObject, tags=["deployments"],
         summary="Take the canary out, or with none go back to the previous primary")  # fmt: skip
async def rollback_served_name(
    name: str, principal: TenantDep, hoster: HosterDep
) -> ServedNameObject:
    await hoster.rollback(principal.tenant_id, name)
    return await _served(hoster, principal.tenant_id, name)


# --- internal: eval engines ---------------------------------------------------------------------

# The services' own API (the evaluator's engines): never relayed by the gateway, and left out
# of the OpenAPI document, which is for integrators (as the scheduler's trainer webhook is).
internal = APIRouter(
    prefix="/internal",
    tags=["internal"],
    dependencies=[Depends(auth.require_service)],
    include_in_schema=False,
)


@internal.post("/engines", response_model=EngineInfo,
               summary="The job's warm eval engine for a base model (started once, idempotent)")  # fmt: skip
async def open_engine(body: EngineCreate, hoster: HosterDep) -> EngineInfo:
    entry = await asyncio.to_thread(
        hoster.eval_engines.open, body.tenant, body.job_id, body.base_model
    )
    return EngineInfo(
        engine_id=entry.engine_id, base_url=entry.engine.base_url, base_model_name=body.base_model
    )


@internal.post("/engines/{engine_id}/checkpoints", response_model=CheckpointModel,
               summary="Pull, verify and load a checkpoint; the model string that names it")  # fmt: skip
async def load_checkpoint(
    engine_id: str, body: CheckpointLoad, hoster: HosterDep
) -> CheckpointModel:
    name = await asyncio.to_thread(
        hoster.eval_engines.add_checkpoint, engine_id, body.uri, body.step, body.version_id
    )
    return CheckpointModel(model=name)


@internal.delete("/engines/{engine_id}", status_code=204, response_class=Response,
                 summary="Stop an eval engine")  # fmt: skip
async def close_engine(engine_id: str, hoster: HosterDep) -> Response:
    await asyncio.to_thread(hoster.eval_engines.close, engine_id)
    return Response(status_code=204)


@internal.get("/tenants/{tenant}/served_names/{name}", response_model=ServedNow,
              summary="What serves a tenant's served name now (the evaluator's)")  # fmt: skip
def serving_version(
    tenant: Annotated[str, Path(pattern=TENANT_PATTERN)], name: str, session: SessionDep
) -> ServedNow:
    found = registry.serving(session, tenant, name)
    if found is None:
        return ServedNow(name=name, primary=None)
    deployment, version = found
    primary = ServingVersion(
        deployment_id=deployment.id,
        version_id=deployment.version_id,
        version=version.version if version else None,
        model=deployment.served_model_name,
        base_model=version.base_model if version else None,
        checkpoint_uri=version.checkpoint_uri if version else None,
    )
    return ServedNow(name=name, primary=primary)


@internal.post("/deployments/{deployment_id}/wake", response_model=DeploymentObject,
               summary="Load a cold deployment again; answers once it is ready (the gateway's)")  # fmt: skip
async def wake_deployment(deployment_id: str, hoster: HosterDep) -> DeploymentObject:
    return DeploymentObject.of(await hoster.wake(deployment_id))


router = APIRouter()
router.include_router(v1)
router.include_router(internal)
