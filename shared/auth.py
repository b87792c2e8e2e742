"""Tenants and the API keys bound to them: issue, revoke, authenticate, and the FastAPI guards.

Keys look like `tl_<prefix>_<secret>`: 8 lowercase characters users see in listings and we look up
by, then 32 random bytes (urlsafe base64). Only the prefix and a sha256 of the whole key are stored;
a fast hash is right for 256 random bits. The plaintext leaves `issue_api_key` once.

Apps give the guards their database by keeping the engine on `app.state.db_engine` (set in the
lifespan, see shared.db.get_engine) or by overriding `shared.db.get_engine`; `require_admin` reads
`AuthSettings` through the overridable `get_auth_settings` dependency.

Every key has a scope (docs/keys.md): `read` (GET only), `write` (read + every change of the
tenant's data, gateway calls included), `admin` (write + the tenant's own keys) and `internal`
(the platform's own calls through the gateway, and reads; the only scope that may tag a call
with its purpose). Routes ask with `require_scope`, or `require_access` (by HTTP method).

Wherever a key is accepted, so is a delegated credential (`tld.…`, shared.delegation) standing for
a key that still exists, is not revoked and grants the credential's scope (read or write): the
gateway's dashboard calls the services with them for a signed-in user (docs/dashboard.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Literal, get_args
from uuid import uuid4

from fastapi import Depends, HTTPException, Request, status
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Field, Session, SQLModel, col, select

from shared import delegation
from shared.db import UTCDateTime, get_engine, session_scope, utcnow
from shared.settings import AuthSettings, get_settings
from shared.tenancy import is_tenant_id

log = logging.getLogger(__name__)

KEY_PATTERN = re.compile(r"tl_([a-z0-9]{8})_([A-Za-z0-9_-]{43})")
# Tenant ids travel in NATS subjects (tuneloop.<tenant>.…), so no dots, wildcards or spaces.
NAME_MAX_LENGTH = 200
ACCEPTED_KEY_SOURCES = (
    "'Authorization: Bearer <key>', 'x-api-key: <key>', 'x-goog-api-key: <key>' "
    "or the '?key=<key>' query parameter"
)
_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
# Stamping last_used_at on every request would make authentication a write; a minute will do.
_LAST_USED_RESOLUTION = timedelta(minutes=1)
# Compared against when a prefix is unknown, so timing doesn't reveal which prefixes exist.
_NO_SUCH_HASH = hashlib.sha256(b"no such key").hexdigest()
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="tuneloop"'}

Scope = Literal["read", "write", "admin", "internal"]
SCOPES: tuple[Scope, ...] = get_args(Scope)
DEFAULT_SCOPE: Scope = "write"
# What a key of each scope may do, named by the scopes a route accepts: an admin key does what
# a write key does; an internal key reads and calls the gateway, but changes nothing else.
_GRANTS: dict[Scope, frozenset[Scope]] = {
    "read": frozenset({"read"}),
    "write": frozenset({"read", "write"}),
    "admin": frozenset({"read", "write", "admin"}),
    "internal": frozenset({"read", "internal"}),
}
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Tenant(SQLModel, table=True):
    __tablename__ = "auth_tenants"

    id: str = Field(primary_key=True, max_length=63)
    name: str = Field(max_length=NAME_MAX_LENGTH)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ApiKey(SQLModel, table=True):
    __tablename__ = "auth_api_keys"

    id: str = Field(default_factory=lambda: uuid4().hex, primary_key=True, max_length=32)
    tenant_id: str = Field(
        foreign_key="auth_tenants.id", ondelete="CASCADE", index=True, max_length=63
    )
    name: str = Field(max_length=NAME_MAX_LENGTH)
    prefix: str = Field(unique=True, index=True, max_length=8)
    key_hash: str = Field(max_length=64, repr=False)
    # Keys issued before scopes existed keep the full rights they had (the migration's default).
    scope: str = Field(
        default=DEFAULT_SCOPE, max_length=16, sa_column_kwargs={"server_default": DEFAULT_SCOPE}
    )
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    last_used_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


@dataclass(frozen=True)
class Principal:
    """Who made a request: the tenant everything it touches is scoped to, and the key it used."""

    tenant_id: str
    key_id: str
    scope: Scope = DEFAULT_SCOPE

    def may(self, *accepted: Scope) -> bool:
        """Whether this key's scope grants any of the `accepted` ones."""
        return any(scope in _GRANTS[self.scope] for scope in accepted)


class AuthError(Exception):
    """Authentication failed. Messages are safe to return: they never contain the presented key."""


class MissingKeyError(AuthError):
    pass


class MalformedKeyError(AuthError):
    pass


class UnknownKeyError(AuthError):
    pass


class RevokedKeyError(AuthError):
    pass


class ScopeError(Exception):
    """The key is valid but its scope does not allow the call (maps to 403). The message names
    the scope needed and never contains the key."""


class AuthInputError(ValueError):
    """An argument is invalid; the message names it (maps to 422)."""


class TenantExistsError(Exception):
    """The tenant id is taken (maps to 409)."""


class NotFoundError(LookupError):
    """A tenant or key doesn't exist for the caller (maps to 404)."""


class TenantNotFoundError(NotFoundError):
    pass


class ApiKeyNotFoundError(NotFoundError):
    pass


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _check_name(name: str, *, field: str) -> None:
    if not name.strip() or len(name) > NAME_MAX_LENGTH:
        raise AuthInputError(f"{field}: must be 1-{NAME_MAX_LENGTH} characters, not blank")


def check_scope(principal: Principal, *accepted: Scope, action: str) -> Principal:
    """The principal, if its key's scope grants one of `accepted`; else ScopeError naming what
    `action` (e.g. `POST /v1/files`) needs."""
    if principal.may(*accepted):
        return principal
    needed = " or ".join(repr(scope) for scope in accepted)
    raise ScopeError(
        f"this API key has scope {principal.scope!r}; {action} needs a key with scope {needed}"
    )


def scopes_for_method(method: str) -> tuple[Scope, ...]:
    """The default rule: reading (GET, HEAD) needs `read`, any other method `write`."""
    return ("read",) if method.upper() in _READ_METHODS else ("write",)


# --- crud -------------------------------------------------------------------------------------


def create_tenant(session: Session, *, tenant_id: str, name: str) -> Tenant:
    if not is_tenant_id(tenant_id):
        raise AuthInputError(
            f"tenant_id: {tenant_id[:80]!r} must be 1-63 lowercase letters, digits, inner - or _"
        )
    _check_name(name, field="name")
    if session.get(Tenant, tenant_id) is not None:
        raise TenantExistsError(f"tenant {tenant_id!r} already exists")
    tenant = Tenant(id=tenant_id, name=name)
    session.add(tenant)
    try:
        session.commit()
    except IntegrityError:  # created by another process since the check above
        session.rollback()
        raise TenantExistsError(f"tenant {tenant_id!r} already exists") from None
    session.refresh(tenant)
    return tenant


def ensure_tenant(session: Session, *, tenant_id: str, name: str | None = None) -> bool:
    """Create the tenant unless it exists; returns whether it was created."""
    if session.get(Tenant, tenant_id) is not None:
        return False
    try:
        create_tenant(session, tenant_id=tenant_id, name=name or tenant_id)
    except TenantExistsError:  # created by another process just now
        return False
    return True


def _unused_prefix(session: Session) -> str:
    # 36**8 prefixes make a clash rare; the loop makes it harmless.
    for _ in range(10):
        prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(8))
        if session.exec(select(ApiKey.id).where(ApiKey.prefix == prefix)).first() is None:
            return prefix
    raise RuntimeError("could not find an unused API key prefix in 10 tries")


def issue_api_key(
    session: Session, *, tenant_id: str, name: str, scope: str = DEFAULT_SCOPE
) -> tuple[ApiKey, str]:
    """Create a key for the tenant; returns the row and the plaintext (shown to the user once)."""
    _check_name(name, field="name")
    if scope not in SCOPES:
        raise AuthInputError(f"scope: {scope[:40]!r} is not one of {', '.join(SCOPES)}")
    if session.get(Tenant, tenant_id) is None:
        raise TenantNotFoundError(f"tenant {tenant_id!r} does not exist")
    prefix = _unused_prefix(session)
    plaintext = f"tl_{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey(
        tenant_id=tenant_id, name=name, prefix=prefix, key_hash=hash_key(plaintext), scope=scope
    )
    session.add(key)
    session.commit()
    session.refresh(key)
    log.info("issued %s API key %s (%s) for tenant %s", scope, key.id, prefix, tenant_id)
    return key, plaintext


def list_api_keys(session: Session, *, tenant_id: str) -> list[ApiKey]:
    statement = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(col(ApiKey.created_at))
    return list(session.exec(statement).all())


def revoke_api_key(session: Session, *, tenant_id: str, key_id: str) -> ApiKey:
    """Revoke one of the tenant's keys (idempotent). Another tenant's key id is simply not found."""
    statement = select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id)
    key = session.exec(statement).first()
    if key is None:
        raise ApiKeyNotFoundError(f"API key {key_id!r} not found for tenant {tenant_id!r}")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.add(key)
        session.commit()
        session.refresh(key)
        log.info("revoked API key %s (%s) of tenant %s", key.id, key.prefix, tenant_id)
    return key


def authenticate(
    session: Session, presented_key: str, *, delegation_secret: bytes | None = None
) -> Principal:
    """The principal a key (or a delegated credential) stands for; raises Malformed-, Unknown- or
    RevokedKeyError. `delegation_secret`: the delegations' MAC key, else the service token's."""
    if delegation.is_delegation(presented_key):
        return _delegated(session, presented_key, delegation_secret or _delegation_secret())
    match = KEY_PATTERN.fullmatch(presented_key)
    if match is None:
        raise MalformedKeyError(
            "API key is malformed: tuneloop keys look like tl_<8 characters>_<secret>"
        )
    key = session.exec(select(ApiKey).where(ApiKey.prefix == match.group(1))).first()
    stored_hash = key.key_hash if key is not None else _NO_SUCH_HASH
    if not hmac.compare_digest(hash_key(presented_key), stored_hash) or key is None:
        raise UnknownKeyError("API key is not recognised")
    # Only the holder of the real key learns that it was revoked.
    if key.revoked_at is not None:
        raise RevokedKeyError(f"API key {key.prefix} was revoked")
    principal = Principal(tenant_id=key.tenant_id, key_id=key.id, scope=_scope(key.scope))
    _touch(session, key)
    return principal


def _delegated(session: Session, presented: str, secret: bytes) -> Principal:
    """The principal of a delegated credential: its key's tenant and id, the credential's scope
    (which the key's own must grant). A revoked key's credentials stop with it."""
    try:
        claims = delegation.verify(presented, secret=secret, now=time.time())
    except delegation.DelegationError as exc:
        raise UnknownKeyError(str(exc)) from None
    key = session.get(ApiKey, claims.key_id)
    if key is None or key.tenant_id != claims.tenant_id:
        raise UnknownKeyError("delegated credential names no key of its tenant")
    if key.revoked_at is not None:
        raise RevokedKeyError(f"API key {key.prefix} was revoked")
    if claims.scope not in _GRANTS[_scope(key.scope)]:
        raise UnknownKeyError(
            f"delegated credential claims scope {claims.scope!r} beyond its key's"
        )
    _touch(session, key)
    return Principal(tenant_id=key.tenant_id, key_id=key.id, scope=claims.scope)


def _delegation_secret() -> bytes:
    return delegation.signing_key(get_settings().auth.service_token.get_secret_value())


def _scope(stored: str) -> Scope:
    # A value no release writes (edited by hand) grants the least, not an error per request.
    for scope in SCOPES:
        if scope == stored:
            return scope
    log.warning("API key with unknown scope %r treated as read-only", stored[:16])
    return "read"


def _touch(session: Session, key: ApiKey) -> None:
    now = utcnow()
    if key.last_used_at is not None and now - key.last_used_at < _LAST_USED_RESOLUTION:
        return
    key.last_used_at = now
    session.add(key)
    try:
        session.commit()
    except SQLAlchemyError as exc:
        # A busy database must not turn a valid key into a failed request; the stamp is advisory.
        session.rollback()
        log.warning("could not record last use of API key %s: %s", key.id, type(exc).__name__)


# --- FastAPI guards ---------------------------------------------------------------------------


def presented_key(request: Request) -> str | None:
    """The key in whichever place the caller's SDK puts it (OpenAI, Anthropic, Gemini), or None."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    for source in (request.headers.get("x-api-key"), request.headers.get("x-goog-api-key")):
        if source and source.strip():
            return source.strip()
    query_key = request.query_params.get("key", "").strip()
    return query_key or None


def require_principal(
    request: Request, engine: Annotated[Engine, Depends(get_engine)]
) -> Principal:
    """FastAPI dependency: the authenticated principal, or 401 saying what went wrong."""
    try:
        key = presented_key(request)
        if key is None:
            raise MissingKeyError(f"missing API key: send it as {ACCEPTED_KEY_SOURCES}")
        with session_scope(engine) as session:
            return authenticate(session, key)
    except AuthError as exc:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, detail=str(exc), headers=_CHALLENGE
        ) from None


PrincipalDep = Annotated[Principal, Depends(require_principal)]


def forbidden(exc: ScopeError) -> HTTPException:
    return HTTPException(status.HTTP_403_FORBIDDEN, detail=str(exc))


def require_scope(*accepted: Scope) -> Callable[[Request, Principal], Principal]:
    """A FastAPI dependency: the authenticated principal (401 as `require_principal`), whose
    key's scope grants one of `accepted` (else 403 naming the scope needed)."""
    if not accepted or any(scope not in SCOPES for scope in accepted):
        raise ValueError(f"require_scope: give one or more of {', '.join(SCOPES)}")

    def scoped(request: Request, principal: PrincipalDep) -> Principal:
        try:
            return check_scope(principal, *accepted, action=_action(request))
        except ScopeError as exc:
            raise forbidden(exc) from None

    return scoped


def require_access(request: Request, principal: PrincipalDep) -> Principal:
    """A FastAPI dependency for a whole router: `scopes_for_method` decides (a read key may
    GET, and gets 403 on every change)."""
    try:
        return check_scope(principal, *scopes_for_method(request.method), action=_action(request))
    except ScopeError as exc:
        raise forbidden(exc) from None


def _action(request: Request) -> str:
    return f"{request.method} {request.url.path}"


WriterDep = Annotated[Principal, Depends(require_scope("write"))]


def get_auth_settings() -> AuthSettings:
    """FastAPI dependency for the admin token; tests override it."""
    return get_settings().auth


def _require_token(request: Request, expected: SecretStr, variable: str, what: str) -> None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail=f"{what} required: send 'Authorization: Bearer <{variable}>'",
            headers=_CHALLENGE,
        )
    # Bytes, because compare_digest refuses non-ASCII str and a caller controls this one.
    if not hmac.compare_digest(token.strip().encode(), expected.get_secret_value().encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, detail=f"{what} is not valid", headers=_CHALLENGE
        )


def require_admin(
    request: Request, settings: Annotated[AuthSettings, Depends(get_auth_settings)]
) -> None:
    """FastAPI dependency: the request must carry `Authorization: Bearer <admin token>`."""
    _require_token(request, settings.admin_token, "TUNELOOP_AUTH_ADMIN_TOKEN", "admin token")


def require_service(
    request: Request, settings: Annotated[AuthSettings, Depends(get_auth_settings)]
) -> None:
    """FastAPI dependency for internal routes (one service calling another): the request must
    carry `Authorization: Bearer <service token>`."""
    _require_token(request, settings.service_token, "TUNELOOP_AUTH_SERVICE_TOKEN", "service token")


class CachedAuthenticator:
    """`authenticate` with a short in-process memory, for the gateway's hot path.

    Only successes are remembered, for `ttl_s`; a revoked key stops working within that time.
    `verify` (async) asks the database in a worker thread, one query per key however many calls
    wait for it, so a cache miss never blocks the event loop; calling the object does the same
    synchronously, for code that is not on the hot path.
    """

    def __init__(self, engine: Engine, *, ttl_s: float = 30.0, max_entries: int = 10_000) -> None:
        self._engine = engine
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._pending: dict[str, asyncio.Future[Principal]] = {}

    def cached(self, presented: str) -> Principal | None:
        """The principal if this key was verified less than `ttl_s` ago, else None."""
        hit = self._cache.get(hash_key(presented))
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        return None

    def __call__(self, presented: str) -> Principal:
        return self.cached(presented) or self._remember(presented, self._lookup(presented))

    async def verify(self, presented: str) -> Principal:
        """The principal of `presented`; raises AuthError. The event loop never waits on SQL."""
        hit = self.cached(presented)
        if hit is not None:
            return hit
        digest = hash_key(presented)
        pending = self._pending.get(digest)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(self._lookup, presented))
            self._pending[digest] = pending
            pending.add_done_callback(lambda done: self._settled(digest, done))
        principal = await asyncio.shield(pending)
        return self._remember(presented, principal)

    def _settled(self, digest: str, done: asyncio.Future[Principal]) -> None:
        self._pending.pop(digest, None)
        if not done.cancelled():
            done.exception()  # retrieved here: every waiter may have gone (cancelled)

    def _lookup(self, presented: str) -> Principal:
        with session_scope(self._engine) as session:
            return authenticate(session, presented)

    def _remember(self, presented: str, principal: Principal) -> Principal:
        if delegation.is_delegation(presented):
            return principal  # minted per use and short-lived: kept, it would outlive its expiry
        if len(self._cache) >= self._max_entries:
            self._cache.clear()  # rare; simpler than LRU bookkeeping on every hit
        self._cache[hash_key(presented)] = (time.monotonic() + self._ttl_s, principal)
        return principal
