"""Dashboard sessions: a tenant's API key exchanged once for an HttpOnly cookie, and the checks
every change passes (its CSRF token, its Origin, its scope).

The key is checked at sign-in and then dropped: the session (tenant, key id, scope, CSRF token,
expiry) lives server-side in a NATS key-value bucket under the sha256 of the cookie's random
token, so every gateway process and replica sees it, sign-out ends it everywhere, and a copy of
the bucket holds no usable cookie. The services are then called with short-lived credentials
minted per request (shared/delegation.py). docs/dashboard.md says why this design.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import nats.js.errors
from fastapi import Request, Response
from nats.aio.client import Client as NatsClient
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from shared import auth
from shared.delegation import DelegatedScope

COOKIE = "tuneloop_session"
# The sign-in form's own CSRF token (double submit): a page elsewhere cannot sign a browser in
# with the attacker's key (login CSRF), as it can neither read nor set this cookie.
SIGN_IN_COOKIE = "tuneloop_sign_in"
PATH = "/ui"
BUCKET = "tuneloop_ui_sessions"
LIFETIME_S = 8 * 3600
_BUCKET_BYTES = 16 * 1024**2  # ~50k sessions of ~300 bytes; JetStream reserves it up front


class UiError(Exception):
    """A dashboard request refused or failed; `status` is its HTTP status, the message is shown
    to the user (never a key, never a credential). Mapped once (routes.error_page)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SignedOut(UiError):
    """No session, an expired one, or one whose key was revoked: back to the sign-in form."""

    def __init__(self, message: str = "sign in with a tenant API key") -> None:
        super().__init__(401, message)


@dataclass(frozen=True)
class UiSession:
    tenant_id: str
    key_id: str
    key_prefix: str  # shown ("tl_abcd1234_…"); not a secret
    scope: DelegatedScope  # what the dashboard may do for this key: write, or read only
    csrf: str
    expires_at: int

    @property
    def may_change(self) -> bool:
        return self.scope == "write"


def dashboard_scope(principal: auth.Principal) -> DelegatedScope:
    """At most `write`: the dashboard never holds a key's admin rights (its keys) or internal ones."""
    return "write" if principal.may("write") else "read"


class SessionStore:
    """Sessions in a JetStream key-value bucket (made on first use, with limits)."""

    def __init__(self, connection: Callable[[], NatsClient | None]) -> None:
        self._connection = connection
        self._kv: KeyValue | None = None
        self._lock = asyncio.Lock()

    async def create(self, principal: auth.Principal, key_prefix: str) -> tuple[str, UiSession]:
        """A new session for this key: the cookie's token (shown to the browser only) and the
        session."""
        token = secrets.token_urlsafe(32)
        session = UiSession(
            tenant_id=principal.tenant_id,
            key_id=principal.key_id,
            key_prefix=key_prefix,
            scope=dashboard_scope(principal),
            csrf=secrets.token_urlsafe(32),
            expires_at=int(time.time()) + LIFETIME_S,
        )
        kv = await self._bucket()
        await kv.put(_entry(token), json.dumps(asdict(session)).encode())
        return token, session

    async def get(self, token: str) -> UiSession | None:
        if not token or len(token) > 128:
            return None
        kv = await self._bucket()
        try:
            entry = await kv.get(_entry(token))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        if entry.value is None:
            return None
        session = UiSession(**json.loads(entry.value))
        return session if session.expires_at > time.time() else None

    async def end(self, token: str) -> None:
        if token and len(token) <= 128:
            await (await self._bucket()).purge(_entry(token))

    async def _bucket(self) -> KeyValue:
        if self._kv is not None:
            return self._kv
        async with self._lock:
            if self._kv is None:
                connection = self._connection()
                if connection is None or not connection.is_connected:
                    raise UiError(503, "the event bus (NATS) is unavailable; retry in a moment")
                config = KeyValueConfig(
                    bucket=BUCKET,
                    description="tuneloop dashboard sessions (services/ingest/ui/sessions.py)",
                    history=1,
                    ttl=LIFETIME_S,
                    max_bytes=_BUCKET_BYTES,
                    max_value_size=2048,
                    storage=StorageType.FILE,
                )
                js = connection.jetstream()
                try:
                    self._kv = await js.create_key_value(config)
                except nats.js.errors.BadRequestError:
                    # Made by a release with other limits: use it as it is.
                    self._kv = await js.key_value(BUCKET)
            return self._kv


def _entry(token: str) -> str:
    # The token's hash, not the token: a copy of the bucket holds no cookie that signs anyone in.
    return hashlib.sha256(token.encode()).hexdigest()


# --- cookies ------------------------------------------------------------------------------------


def set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    """HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), Secure
    when the dashboard is served over https, scoped to /ui."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(request: Request, response: Response, name: str) -> None:
    set_cookie(request, response, name, "", max_age=0)


# --- what a change must carry -------------------------------------------------------------------


def check_origin(request: Request) -> None:
    """A change must come from a page of this dashboard: its Origin (else its Referer) is the
    origin the request was sent to. Browsers send Origin with every POST."""
    sent = request.headers.get("origin") or _origin_of(request.headers.get("referer", ""))
    own = f"{request.url.scheme}://{request.url.netloc}"
    if not sent or sent == "null":
        raise UiError(403, "refused: a change needs the Origin header of this dashboard's page")
    if sent != own:
        raise UiError(403, f"refused: the request came from {sent[:100]}, not from {own}")


def check_token(sent: str | None, expected: str) -> None:
    if not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise UiError(403, "refused: the form's CSRF token is missing or wrong; reload the page")


def check_change(request: Request, session: UiSession, csrf: str | None, action: str) -> None:
    """Origin, CSRF token, then scope: a read key is shown every button disabled, and refused
    here if it presses one anyway."""
    check_origin(request)
    check_token(csrf, session.csrf)
    if not session.may_change:
        raise UiError(
            403,
            f"this API key has scope {session.scope!r}; {action} needs a key with scope 'write'",
        )


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
