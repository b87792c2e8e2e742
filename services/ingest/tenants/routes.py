"""HTTP routes of tenants and their API keys. The operator's (`/v1/admin/...`, the admin token):
create a tenant, issue a key for any tenant. A tenant's own (`/v1/keys`, a key of `admin`
scope): list, issue, revoke. `tuneloop keys` does the operator's from the command line.

No HTTP route issues an `internal` key: only the operator's command line does (docs/keys.md), so
no credential that travels over HTTP can mint one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, field_validator
from sqlalchemy.engine import Engine

from services.ingest.http.deps import EngineDep
from services.ingest.http.errors import Conflict, NotFound, Unprocessable
from shared import auth
from shared.db import session_scope

router = APIRouter()
AdminDep = Annotated[auth.Principal, Depends(auth.require_scope("admin"))]
INTERNAL_BY_CLI = (
    "scope: 'internal' keys are issued only by the operator's command line "
    "(`tuneloop keys create --tenant <id> --scope internal`), never over HTTP"
)


class TenantIn(BaseModel):
    id: str = Field(description="slug: lowercase letters, digits, - or _")
    name: str


class Tenant(BaseModel):
    id: str
    name: str


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


@contextmanager
def _auth_refusals() -> Iterator[None]:
    """shared.auth's refusals (they carry no HTTP status) as ingest's, their messages kept."""
    try:
        yield
    except auth.AuthInputError as exc:
        raise Unprocessable(str(exc)) from None
    except auth.TenantExistsError as exc:
        raise Conflict(str(exc)) from None
    except auth.TenantNotFoundError as exc:
        raise NotFound(str(exc)) from None


def issue(engine: Engine, *, tenant_id: str, body: KeyIn) -> IssuedKey:
    """Issue a key (the operator's route and the tenant's share this); 422 / 404 naming what is
    wrong."""
    with _auth_refusals(), session_scope(engine) as session:
        key, plaintext = auth.issue_api_key(
            session, tenant_id=tenant_id, name=body.name, scope=body.scope
        )
        return IssuedKey(**KeyOut.of(key).model_dump(), tenant=tenant_id, key=plaintext)


# --- the operator's: the admin token ----------------------------------------------------------


@router.post(
    "/v1/admin/tenants",
    tags=["admin"],
    status_code=201,
    response_model=Tenant,
    dependencies=[Depends(auth.require_admin)],
)
def create_tenant(body: TenantIn, engine: EngineDep) -> Tenant:
    with _auth_refusals(), session_scope(engine) as session:
        tenant = auth.create_tenant(session, tenant_id=body.id, name=body.name)
        return Tenant(id=tenant.id, name=tenant.name)


@router.post(
    "/v1/admin/tenants/{tenant_id}/api_keys",
    tags=["admin"],
    status_code=201,
    response_model=IssuedKey,
    dependencies=[Depends(auth.require_admin)],
)
def issue_key(tenant_id: str, body: KeyIn, engine: EngineDep) -> IssuedKey:
    """The key is shown once; only its hash is stored. `scope` defaults to write."""
    return issue(engine, tenant_id=tenant_id, body=body)


# --- a tenant's own: a key of admin scope -----------------------------------------------------


@router.get(
    "/v1/keys", tags=["keys"], response_model=KeyList, summary="The tenant's API keys (no secrets)"
)
def list_keys(principal: AdminDep, engine: EngineDep) -> KeyList:
    with session_scope(engine) as session:
        keys = auth.list_api_keys(session, tenant_id=principal.tenant_id)
        return KeyList(data=[KeyOut.of(key) for key in keys])


@router.post(
    "/v1/keys",
    tags=["keys"],
    response_model=IssuedKey,
    status_code=201,
    summary="Issue an API key for the caller's tenant (read, write or admin)",
)
def create_key(body: KeyIn, principal: AdminDep, engine: EngineDep) -> IssuedKey:
    return issue(engine, tenant_id=principal.tenant_id, body=body)


@router.delete(
    "/v1/keys/{key_id}",
    tags=["keys"],
    response_model=KeyOut,
    summary="Revoke one of the tenant's keys",
)
def revoke_key(key_id: str, principal: AdminDep, engine: EngineDep) -> KeyOut:
    """Idempotent; a revoked key stops working within the gateway's key cache time (30 s)."""
    try:
        with session_scope(engine) as session:
            key = auth.revoke_api_key(session, tenant_id=principal.tenant_id, key_id=key_id)
            return KeyOut.of(key)
    except auth.ApiKeyNotFoundError:
        raise NotFound(f"key {key_id!r} not found") from None
