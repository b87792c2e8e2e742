"""Short-lived credentials that stand for a tenant's API key: how the gateway's dashboard calls the
services for a signed-in user without keeping the key it signed in with.

`tld.<claims>.<signature>`: the claims (JSON, base64url) name the key's id and tenant, a scope no
wider than `write` and an expiry at most MAX_TTL_S away; the signature is HMAC-SHA256 under a key
derived from TUNELOOP_AUTH_SERVICE_TOKEN, which every service already holds. Whoever holds that
token can already act for any tenant on the internal routes, so accepting these adds no power to
it; the derivation keeps the token itself from ever being the MAC key of something a browser's
traffic carries. shared.auth.authenticate accepts a credential like any key once the key it
names exists, is not revoked and grants the scope (docs/dashboard.md says why this design).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Literal, get_args

PREFIX = "tld."
DEFAULT_TTL_S = 60
MAX_TTL_S = 300
# What a delegation may carry: never `admin` (a tenant's keys) nor `internal` (the platform's).
DelegatedScope = Literal["read", "write"]
DELEGATED_SCOPES: tuple[DelegatedScope, ...] = get_args(DelegatedScope)
_PATTERN = re.compile(r"tld\.([A-Za-z0-9_-]{1,400})\.([A-Za-z0-9_-]{43})")
_CONTEXT = b"tuneloop delegation v1"


class DelegationError(ValueError):
    """A credential refused: malformed, forged, expired or overlong. Never holds the credential."""


@dataclass(frozen=True)
class Claims:
    key_id: str
    tenant_id: str
    scope: DelegatedScope
    expires_at: int  # unix seconds


def signing_key(service_token: str) -> bytes:
    """The MAC key, derived from the service token (never the token itself)."""
    return hmac.new(service_token.encode(), _CONTEXT, hashlib.sha256).digest()


def is_delegation(presented: str) -> bool:
    return presented.startswith(PREFIX)


def mint(claims: Claims, *, secret: bytes) -> str:
    if claims.scope not in DELEGATED_SCOPES:
        raise ValueError(
            f"scope: a delegation carries one of {DELEGATED_SCOPES}, not {claims.scope!r}"
        )
    body = {"k": claims.key_id, "t": claims.tenant_id, "s": claims.scope, "e": claims.expires_at}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{PREFIX}{payload}.{_b64(_mac(secret, payload))}"


def verify(presented: str, *, secret: bytes, now: float) -> Claims:
    """The claims of a credential this secret signed that is still valid at `now`."""
    match = _PATTERN.fullmatch(presented)
    if match is None:
        raise DelegationError("malformed delegated credential")
    payload, signature = match.groups()
    if not hmac.compare_digest(_unb64(signature), _mac(secret, payload)):
        raise DelegationError("delegated credential has a bad signature")
    claims = _claims(_unb64(payload))
    if claims.expires_at <= now:
        raise DelegationError("delegated credential expired")
    if claims.expires_at > now + MAX_TTL_S:
        raise DelegationError(f"delegated credential lives longer than {MAX_TTL_S} s")
    return claims


def _claims(raw: bytes) -> Claims:
    try:
        body = json.loads(raw)
        claims = Claims(str(body["k"]), str(body["t"]), body["s"], int(body["e"]))
    except (ValueError, KeyError, TypeError):
        raise DelegationError("delegated credential has unreadable claims") from None
    if claims.scope not in DELEGATED_SCOPES:
        raise DelegationError(f"delegated credential claims scope {claims.scope!r}")
    return claims


def _mac(secret: bytes, payload: str) -> bytes:
    return hmac.new(secret, (PREFIX + payload).encode(), hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise DelegationError("malformed delegated credential") from None
