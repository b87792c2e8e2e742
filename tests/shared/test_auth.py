"""Tenants and API keys: issuing, authenticating, revoking, isolation, and the FastAPI guards."""

import asyncio
import hashlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from shared.auth import (
    KEY_PATTERN,
    ApiKey,
    ApiKeyNotFoundError,
    AuthInputError,
    CachedAuthenticator,
    MalformedKeyError,
    Principal,
    PrincipalDep,
    RevokedKeyError,
    Tenant,
    TenantExistsError,
    TenantNotFoundError,
    UnknownKeyError,
    authenticate,
    create_tenant,
    get_auth_settings,
    issue_api_key,
    list_api_keys,
    require_admin,
    revoke_api_key,
)
from shared.db import get_engine
from shared.settings import AuthSettings

ADMIN_TOKEN = "test-admin-token-0f9e8d7c"
WELL_FORMED_UNKNOWN = "tl_zzzzzzzz_" + "A" * 43


@pytest.fixture
def acme(db_session: Session) -> Tenant:
    return create_tenant(db_session, tenant_id="acme", name="Acme Corp")


@pytest.fixture
def acme_key(db_session: Session, acme: Tenant) -> tuple[ApiKey, str]:
    return issue_api_key(db_session, tenant_id=acme.id, name="ci")


def _tampered(key: str) -> str:
    return key[:-1] + ("B" if key[-1] == "A" else "A")


# --- crud -------------------------------------------------------------------------------------


def test_issued_key_authenticates_as_its_tenant(
    db_session: Session, acme_key: tuple[ApiKey, str]
) -> None:
    key, plaintext = acme_key

    assert KEY_PATTERN.fullmatch(plaintext)
    assert plaintext.startswith(f"tl_{key.prefix}_")
    assert authenticate(db_session, plaintext) == Principal(tenant_id="acme", key_id=key.id)


def test_keys_are_hashed_at_rest(db_engine: Engine, db_session: Session, acme: Tenant) -> None:
    key, plaintext = issue_api_key(db_session, tenant_id="acme", name="ci")
    secret = plaintext.split("_", 2)[2]

    with db_engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM auth_api_keys")).mappings().all()
    stored = " ".join(str(value) for row in rows for value in row.values())
    assert secret not in stored
    assert plaintext not in stored
    assert [row["key_hash"] for row in rows] == [hashlib.sha256(plaintext.encode()).hexdigest()]
    assert key.key_hash not in repr(key)  # logs of the model don't carry the hash either


def test_authentication_stamps_last_use(db_session: Session, acme_key: tuple[ApiKey, str]) -> None:
    key, plaintext = acme_key
    assert key.last_used_at is None

    authenticate(db_session, plaintext)

    db_session.refresh(key)
    assert key.last_used_at is not None
    assert key.last_used_at >= key.created_at


def test_revoked_key_is_refused_and_revoking_again_changes_nothing(
    db_session: Session, acme_key: tuple[ApiKey, str]
) -> None:
    key, plaintext = acme_key

    revoked = revoke_api_key(db_session, tenant_id="acme", key_id=key.id)
    assert revoked.revoked_at is not None
    with pytest.raises(RevokedKeyError, match=f"API key {key.prefix} was revoked") as caught:
        authenticate(db_session, plaintext)
    assert plaintext not in str(caught.value)

    again = revoke_api_key(db_session, tenant_id="acme", key_id=key.id)
    assert again.revoked_at == revoked.revoked_at


def test_unknown_and_tampered_keys_get_the_same_answer(
    db_session: Session, acme_key: tuple[ApiKey, str]
) -> None:
    _, plaintext = acme_key
    messages = []
    for presented in (_tampered(plaintext), WELL_FORMED_UNKNOWN):
        with pytest.raises(UnknownKeyError) as caught:
            authenticate(db_session, presented)
        assert presented not in str(caught.value)
        messages.append(str(caught.value))
    # Same message whether or not the prefix exists: no oracle for valid prefixes.
    assert messages == ["API key is not recognised"] * 2


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "sk-not-ours",
        "tl_short_" + "A" * 43,
        "tl_abcd1234_" + "A" * 42,
        "tl_ABCD1234_" + "A" * 43,
    ],
)
def test_malformed_keys_are_refused(db_session: Session, presented: str) -> None:
    with pytest.raises(MalformedKeyError, match="tl_<8 characters>_<secret>") as caught:
        authenticate(db_session, presented)
    assert not presented or presented not in str(caught.value)


def test_tenants_cannot_see_or_revoke_each_others_keys(db_session: Session) -> None:
    create_tenant(db_session, tenant_id="acme", name="Acme")
    create_tenant(db_session, tenant_id="globex", name="Globex")
    acme_key, acme_plain = issue_api_key(db_session, tenant_id="acme", name="a")
    globex_key, globex_plain = issue_api_key(db_session, tenant_id="globex", name="g")

    assert [k.id for k in list_api_keys(db_session, tenant_id="acme")] == [acme_key.id]
    assert [k.id for k in list_api_keys(db_session, tenant_id="globex")] == [globex_key.id]
    with pytest.raises(ApiKeyNotFoundError, match="not found for tenant 'globex'"):
        revoke_api_key(db_session, tenant_id="globex", key_id=acme_key.id)

    assert authenticate(db_session, acme_plain).tenant_id == "acme"  # still valid
    assert authenticate(db_session, globex_plain).tenant_id == "globex"


def test_deleting_a_tenant_deletes_its_keys(
    db_session: Session, acme: Tenant, acme_key: tuple[ApiKey, str]
) -> None:
    db_session.delete(acme)
    db_session.commit()

    db_session.expunge_all()
    assert db_session.exec(select(ApiKey)).all() == []


@pytest.mark.parametrize("tenant_id", ["", "Acme", "acme.corp", "acme*", "-acme", "a" * 64])
def test_tenant_ids_must_be_subject_safe_slugs(db_session: Session, tenant_id: str) -> None:
    with pytest.raises(AuthInputError, match="tenant_id"):
        create_tenant(db_session, tenant_id=tenant_id, name="Bad")


def test_tenant_ids_are_unique(db_session: Session, acme: Tenant) -> None:
    with pytest.raises(TenantExistsError, match="'acme' already exists"):
        create_tenant(db_session, tenant_id="acme", name="Another Acme")


def test_keys_need_an_existing_tenant_and_a_name(db_session: Session, acme: Tenant) -> None:
    with pytest.raises(TenantNotFoundError, match="'initech' does not exist"):
        issue_api_key(db_session, tenant_id="initech", name="ci")
    with pytest.raises(AuthInputError, match="name"):
        issue_api_key(db_session, tenant_id="acme", name="   ")
    assert list_api_keys(db_session, tenant_id="acme") == []


# --- FastAPI guards ---------------------------------------------------------------------------


def _app(engine: Engine) -> FastAPI:
    app = FastAPI()
    app.state.db_engine = engine
    app.dependency_overrides[get_auth_settings] = lambda: AuthSettings(
        admin_token=SecretStr(ADMIN_TOKEN)
    )

    @app.get("/whoami")
    def whoami(principal: PrincipalDep) -> dict[str, str]:
        return {"tenant_id": principal.tenant_id, "key_id": principal.key_id}

    @app.get("/admin", dependencies=[Depends(require_admin)])
    def admin() -> dict[str, bool]:
        return {"admin": True}

    return app


KEY_STYLES: dict[str, Callable[[str], dict[str, Any]]] = {
    "openai-bearer": lambda key: {"headers": {"Authorization": f"Bearer {key}"}},
    "anthropic-x-api-key": lambda key: {"headers": {"x-api-key": key}},
    "gemini-x-goog-api-key": lambda key: {"headers": {"x-goog-api-key": key}},
    "gemini-query-key": lambda key: {"params": {"key": key}},
}


@pytest.mark.parametrize("style", KEY_STYLES)
def test_every_sdk_header_style_authenticates(
    db_engine: Engine, acme_key: tuple[ApiKey, str], style: str
) -> None:
    key, plaintext = acme_key
    with TestClient(_app(db_engine)) as client:
        response = client.get("/whoami", **KEY_STYLES[style](plaintext))
    assert response.status_code == 200, response.text
    assert response.json() == {"tenant_id": "acme", "key_id": key.id}


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"x-api-key": " "}]
)
def test_missing_key_is_401_naming_the_accepted_headers(
    db_engine: Engine, headers: dict[str, str]
) -> None:
    with TestClient(_app(db_engine)) as client:
        response = client.get("/whoami", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    detail = response.json()["detail"]
    assert detail.startswith("missing API key")
    for accepted in ("Authorization: Bearer", "x-api-key", "x-goog-api-key", "?key="):
        assert accepted in detail


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("malformed", "API key is malformed"),
        ("unknown", "API key is not recognised"),
        ("tampered", "API key is not recognised"),
        ("revoked", "was revoked"),
    ],
)
def test_bad_keys_are_401_without_echoing_the_key(
    db_engine: Engine,
    db_session: Session,
    acme_key: tuple[ApiKey, str],
    case: str,
    expected: str,
) -> None:
    key, plaintext = acme_key
    presented = {
        "malformed": "sk-live-not-ours-1234",
        "unknown": WELL_FORMED_UNKNOWN,
        "tampered": _tampered(plaintext),
        "revoked": plaintext,
    }[case]
    if case == "revoked":
        revoke_api_key(db_session, tenant_id="acme", key_id=key.id)

    with TestClient(_app(db_engine)) as client:
        response = client.get("/whoami", headers={"x-api-key": presented})
    assert response.status_code == 401
    assert expected in response.json()["detail"]
    assert presented not in response.text


def test_an_app_may_provide_its_engine_by_dependency_override(
    db_engine: Engine, acme_key: tuple[ApiKey, str]
) -> None:
    app = _app(db_engine)
    del app.state.db_engine
    app.dependency_overrides[get_engine] = lambda: db_engine
    with TestClient(app) as client:
        response = client.get("/whoami", headers={"Authorization": f"Bearer {acme_key[1]}"})
    assert response.json()["tenant_id"] == "acme"


@pytest.mark.parametrize(
    ("headers", "status", "expected"),
    [
        ({"Authorization": f"Bearer {ADMIN_TOKEN}"}, 200, None),
        ({"Authorization": "Bearer not-the-admin-token"}, 401, "admin token is not valid"),
        # Non-ASCII must be refused, not crash compare_digest (it only takes ASCII str).
        ({b"Authorization": "Bearer tökén".encode("latin-1")}, 401, "admin token is not valid"),
        ({"x-api-key": ADMIN_TOKEN}, 401, "admin token required"),
        ({}, 401, "admin token required"),
    ],
)
def test_require_admin_wants_the_admin_bearer_token(
    db_engine: Engine,
    headers: dict[str, str] | dict[bytes, bytes],
    status: int,
    expected: str | None,
) -> None:
    with TestClient(_app(db_engine)) as client:
        response = client.get("/admin", headers=headers)
    assert response.status_code == status
    if expected is None:
        assert response.json() == {"admin": True}
    else:
        assert expected in response.json()["detail"]
        assert ADMIN_TOKEN not in response.text


# --- the gateway's cached, async authenticator ---------------------------------------------------


def test_cached_verify_asks_the_database_once_off_the_event_loop(
    db_engine: Engine, acme_key: tuple[ApiKey, str]
) -> None:
    key, plaintext = acme_key
    lookups: list[int] = []  # the thread of each query on the keys table

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "auth_api_keys" in statement:
            lookups.append(threading.get_ident())

    event.listen(db_engine, "before_cursor_execute", note)
    authenticator = CachedAuthenticator(db_engine, ttl_s=60)

    async def scenario() -> tuple[list[Principal], int]:
        calls = [authenticator.verify(plaintext) for _ in range(20)]  # a burst on a cold cache
        return list(await asyncio.gather(*calls)), threading.get_ident()

    try:
        principals, loop_thread = asyncio.run(scenario())
        assert asyncio.run(authenticator.verify(plaintext)) == principals[0]  # cached now
        with pytest.raises(UnknownKeyError):
            asyncio.run(authenticator.verify(_tampered(plaintext)))
    finally:
        event.remove(db_engine, "before_cursor_execute", note)
    assert principals == [Principal(tenant_id="acme", key_id=key.id)] * 20
    assert len(lookups) == 2  # one for the burst and the cached call, one for the tampered key
    assert loop_thread not in lookups
    assert authenticator.cached(_tampered(plaintext)) is None  # failures are not remembered
