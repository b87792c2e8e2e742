"""HTTP routes of a tenant's own API keys (`admin` scope): list, issue, revoke.

The operator's routes (`/v1/admin/...`, the admin token) and `tuneloop keys` do the same for any
tenant. No HTTP route issues an `internal` key: only the operator's command line does
(docs/keys.md), so no credential that travels over HTTP can mint one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, status
from pydantic import BaseModel, field_validator
from sqlalchemy.engine import Engine

from shared import auth
from shared.db import get_engine, session_scope

router = APIRouter(tags=["keys"])
EngineDep = Annotated[Engine, Depends(get_engine)]
AdminDep = Annotated[auth.Principal, Depends(auth.require_scope("admin"))]
INTERNAL_BY_CLI = (
    "scope: 'internal' keys are issued only by the operator's command line "
    "(`tuneloop keys create --tenant <id> --scope internal`), never over HTTP"
)


class KeyIn(BaseModel):
    name: str
    scope: auth.Scope = auth.DEFAULT_SCOPE

    @field_validator("scope")
    @classmethod
    def _not_internal(cls, value: auth.Scope) -> auth.Scope:
        if value == "internal":
            raise ValueError(INTERNAL_BY_CLI)
        return value


class KeyOut(BaseModel):
    """A key as listed: never the key itself, nor its hash."""

    id: str
    object: Literal["api_key"] = "api_key"
    name: str
    prefix: str
    scope: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def of(cls, key: auth.ApiKey) -> KeyOut:
        return cls(
            id=key.id,
            name=key.name,
            prefix=key.prefix,
            scope=key.scope,
            created_at=key.created_at,
            last_used_at=key.last_used_at,
            revoked_at=key.revoked_at,
        )


class IssuedKey(KeyOut):
    """The key as issued: `key` is shown this once; only its hash is stored."""

    tenant: str
    key: str


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyOut]


def issue(engine: Engine, *, tenant_id: str, body: KeyIn) -> IssuedKey:
    """Issue a key (the operator's route shares this); 422 / 404 naming what is wrong."""
    try:
        with session_scope(engine) as session:
            key, plaintext = auth.issue_api_key(
                session, tenant_id=tenant_id, name=body.name, scope=body.scope
            )
            return IssuedKey(**KeyOut.of(key).model_dump(), tenant=tenant_id, key=plaintext)
    except auth.AuthInputError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from None
    except auth.TenantNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc)) from None


@router.get("/v1/keys", response_model=KeyList, summary="The tenant's API keys (no secrets)")
def list_keys(principal: AdminDep, engine: EngineDep) -> KeyList:
    with session_scope(engine) as session:
        keys = auth.list_api_keys(session, tenant_id=principal.tenant_id)
        return KeyList(data=[KeyOut.of(key) for key in keys])


@router.post(
    "/v1/keys",
    response_model=IssuedKey,
    status_code=201,
    summary="Issue an API key for the caller's tenant (read, write or admin)",
)
def create_key(body: KeyIn, principal: AdminDep, engine: EngineDep) -> IssuedKey:
    return issue(engine, tenant_id=principal.tenant_id, body=body)


@router.delete(
    "/v1/keys/{key_id}", response_model=KeyOut, summary="Revoke one of the tenant's keys"
)
def revoke_key(key_id: str, principal: AdminDep, engine: EngineDep) -> KeyOut:
    """Idempotent; a revoked key stops working within the gateway's key cache time (30 s)."""
    try:
        with session_scope(engine) as session:
            key = auth.revoke_api_key(session, tenant_id=principal.tenant_id, key_id=key_id)
            return KeyOut.of(key)
    except auth.ApiKeyNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"key {key_id!r} not found") from exc
