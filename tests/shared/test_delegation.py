"""Delegated credentials (shared/delegation.py) and their acceptance by shared.auth: what the
dashboard's calls stand on. A credential is as good as its key, no wider, and no longer."""

from __future__ import annotations

import time

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session

from shared import delegation
from shared.auth import (
    ApiKey,
    RevokedKeyError,
    Tenant,
    UnknownKeyError,
    authenticate,
    create_tenant,
    issue_api_key,
    require_access,
    revoke_api_key,
)
from shared.delegation import Claims, DelegationError
from shared.settings import get_settings

SECRET = delegation.signing_key("test-service-token-7a6b5c4d")


@pytest.fixture
def acme(db_session: Session) -> Tenant:
    return create_tenant(db_session, tenant_id="acme", name="Acme Corp")


def _key(session: Session, tenant: str, scope: str) -> ApiKey:
    return issue_api_key(session, tenant_id=tenant, name=scope, scope=scope)[0]


def _credential(key: ApiKey, scope: str, *, ttl_s: float = 60, secret: bytes = SECRET) -> str:
    expires = int(time.time() + ttl_s)
    return delegation.mint(Claims(key.id, key.tenant_id, scope, expires), secret=secret)  # type: ignore[arg-type]


def test_a_credential_authenticates_as_its_key_with_its_own_scope(
    db_session: Session, acme: Tenant
) -> None:
    writer = _key(db_session, "acme", "write")
    for scope in ("read", "write"):
        principal = authenticate(db_session, _credential(writer, scope), delegation_secret=SECRET)
        assert (principal.tenant_id, principal.key_id, principal.scope) == (
            "acme",
            writer.id,
            scope,
        )


def test_a_credential_is_never_wider_than_its_key(db_session: Session, acme: Tenant) -> None:
    reader = _key(db_session, "acme", "read")
    with pytest.raises(UnknownKeyError, match="scope 'write' beyond its key's"):
        authenticate(db_session, _credential(reader, "write"), delegation_secret=SECRET)
    admin = _key(db_session, "acme", "admin")
    with pytest.raises(ValueError, match="scope"):
        _credential(admin, "admin")  # mint refuses what no delegation may carry


def test_forged_expired_overlong_and_foreign_credentials_are_refused(
    db_session: Session, acme: Tenant
) -> None:
    writer = _key(db_session, "acme", "write")
    create_tenant(db_session, tenant_id="globex", name="Globex")
    forged = _credential(writer, "read", secret=delegation.signing_key("another token"))
    refused = {
        "bad signature": forged,
        "expired": _credential(writer, "read", ttl_s=-1),
        f"longer than {delegation.MAX_TTL_S} s": _credential(writer, "read", ttl_s=3600),
        "no key of its tenant": delegation.mint(
            Claims(writer.id, "globex", "read", int(time.time()) + 60), secret=SECRET
        ),
        "malformed": "tld.e30.short",
    }
    for reason, credential in refused.items():
        with pytest.raises(UnknownKeyError, match=reason):
            authenticate(db_session, credential, delegation_secret=SECRET)
        assert credential not in reason


def test_a_tampered_claim_breaks_the_signature() -> None:
    token = delegation.mint(Claims("k1", "acme", "read", int(time.time()) + 60), secret=SECRET)
    _, payload, signature = token.split(".")
    widened = delegation._b64(delegation._unb64(payload).replace(b'"read"', b'"write"'))
    with pytest.raises(DelegationError, match="bad signature"):
        delegation.verify(f"tld.{widened}.{signature}", secret=SECRET, now=time.time())


def test_revoking_the_key_stops_its_credentials(db_session: Session, acme: Tenant) -> None:
    writer = _key(db_session, "acme", "write")
    credential = _credential(writer, "write")
    revoke_api_key(db_session, tenant_id="acme", key_id=writer.id)
    with pytest.raises(RevokedKeyError):
        authenticate(db_session, credential, delegation_secret=SECRET)


def test_routes_take_a_credential_signed_with_the_service_token(
    db_engine: Engine, db_session: Session, acme: Tenant
) -> None:
    """Without a secret given, the process's own service token signs: what every service holds."""
    app = FastAPI()
    app.state.db_engine = db_engine

    @app.post("/change", dependencies=[Depends(require_access)])
    def change() -> dict[str, bool]:
        return {"changed": True}

    writer = _key(db_session, "acme", "write")
    own = delegation.signing_key(get_settings().auth.service_token.get_secret_value())
    with TestClient(app) as client:
        for scope, status in (("write", 200), ("read", 403)):
            bearer = {"Authorization": f"Bearer {_credential(writer, scope, secret=own)}"}
            assert client.post("/change", headers=bearer).status_code == status
        bearer = {"Authorization": f"Bearer {_credential(writer, 'write')}"}  # another secret
        answer = client.post("/change", headers=bearer)
        assert answer.status_code == 401
        assert "bad signature" in answer.json()["detail"]
