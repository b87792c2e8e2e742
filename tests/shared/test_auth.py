"""Tenants and API keys: issuing, authenticating, revoking, isolation, and the FastAPI guards."""

import asyncio
import hashlib
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import event, text
from sqlalchemy.engine import URL, Engine
from sqlmodel import Session, select

from shared import db
from shared.auth import (
    KEY_PATTERN,
    SCOPES,
    ApiKey,
    ApiKeyNotFoundError,
    AuthInputError,
    CachedAuthenticator,
    MalformedKeyError,
    Principal,
    PrincipalDep,
    RevokedKeyError,
    Scope,
    ScopeError,
    Tenant,
    TenantExistsError,
    TenantNotFoundError,
    UnknownKeyError,
    authenticate,
    check_scope,
    create_tenant,
    get_auth_settings,
    issue_api_key,
    list_api_keys,
    require_access,
    require_admin,
    require_scope,
    require_service,
    revoke_api_key,
)
from shared.db import get_engine
from shared.settings import AuthSettings

ADMIN_TOKEN = "test-admin-token-0f9e8d7c"
SERVICE_TOKEN = "test-service-token-7a6b5c4d"
WELL_FORMED_UNKNOWN = "tl_zzzzzzzz_" + "A" * 43
SCOPES_PARENT = "5b7c0f2d9a41"  # the revision before API key scopes
NOW = datetime(2026, 12, 1, tzinfo=UTC)


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
        admin_token=SecretStr(ADMIN_TOKEN), service_token=SecretStr(SERVICE_TOKEN)
    )

    @app.get("/whoami")
    def whoami(principal: PrincipalDep) -> dict[str, str]:
        return {"tenant_id": principal.tenant_id, "key_id": principal.key_id}

    @app.get("/admin", dependencies=[Depends(require_admin)])
    def admin() -> dict[str, bool]:
        return {"admin": True}

    @app.get("/internal", dependencies=[Depends(require_service)])
    def internal() -> dict[str, bool]:
        return {"service": True}

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


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Authorization": f"Bearer {ADMIN_TOKEN}"}, "service token is not valid"),
        ({"Authorization": "Bearer tökén".encode("latin-1")}, "service token is not valid"),
        ({}, "service token required"),
    ],
)
def test_require_service_wants_the_service_token_not_the_admin_one(
    db_engine: Engine, headers: dict[str, Any], expected: str
) -> None:
    with TestClient(_app(db_engine)) as client:
        assert client.get(
            "/internal", headers={"Authorization": f"Bearer {SERVICE_TOKEN}"}
        ).json() == {"service": True}
        response = client.get("/internal", headers=headers)
    assert response.status_code == 401
    assert expected in response.json()["detail"]
    assert SERVICE_TOKEN not in response.text


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


# --- scopes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["read", "write", "admin", "internal"])
def test_a_key_carries_its_scope_to_the_principal(
    db_session: Session, acme: Tenant, scope: Scope
) -> None:
    key, plaintext = issue_api_key(db_session, tenant_id="acme", name="k", scope=scope)

    assert key.scope == scope
    assert authenticate(db_session, plaintext) == Principal("acme", key.id, scope)


def test_keys_are_write_keys_unless_told_and_unknown_scopes_are_refused(
    db_session: Session, acme: Tenant
) -> None:
    key, _ = issue_api_key(db_session, tenant_id="acme", name="k")
    assert key.scope == "write"

    with pytest.raises(AuthInputError, match="scope: 'owner' is not one of read, write"):
        issue_api_key(db_session, tenant_id="acme", name="k", scope="owner")


def test_what_each_scope_grants() -> None:
    grants = {
        scope: {wanted for wanted in SCOPES if Principal("acme", "k", scope).may(wanted)}
        for scope in SCOPES
    }
    assert grants == {
        "read": {"read"},
        "write": {"read", "write"},
        "admin": {"read", "write", "admin"},
        "internal": {"read", "internal"},
    }
    read = Principal("acme", "k", "read")
    with pytest.raises(
        ScopeError, match=r"has scope 'read'; POST /x needs .* 'write' or 'internal'"
    ):
        check_scope(read, "write", "internal", action="POST /x")


def test_keys_issued_before_scopes_keep_full_rights(blank_database_url: URL) -> None:
    # The key row as the revision before scopes stored it; the migration must make it `write`.
    db.migrate(blank_database_url, revision=SCOPES_PARENT)
    engine = db.make_engine(blank_database_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO auth_tenants VALUES ('acme', 'Acme', :t)"), {"t": NOW}
            )
            connection.execute(
                text(
                    "INSERT INTO auth_api_keys (id, tenant_id, name, prefix, key_hash, created_at)"
                    " VALUES ('k1', 'acme', 'old', 'abcd1234', :h, :t)"
                ),
                {"h": "0" * 64, "t": NOW},
            )
        db.migrate(blank_database_url)
        with Session(engine) as session:
            assert [key.scope for key in session.exec(select(ApiKey)).all()] == ["write"]
    finally:
        engine.dispose()


def _scoped_app(engine: Engine) -> FastAPI:
    app = FastAPI()
    app.state.db_engine = engine

    @app.post("/things", dependencies=[Depends(require_scope("write"))])
    def change() -> dict[str, bool]:
        return {"changed": True}

    @app.api_route("/by-method", methods=["GET", "DELETE"])
    def by_method(principal: Annotated[Principal, Depends(require_access)]) -> dict[str, str]:
        return {"scope": principal.scope}

    return app


def test_scope_guards_answer_403_naming_the_scope_needed(
    db_engine: Engine, db_session: Session, acme: Tenant
) -> None:
    _, read = issue_api_key(db_session, tenant_id="acme", name="r", scope="read")
    _, write = issue_api_key(db_session, tenant_id="acme", name="w", scope="write")
    _, internal = issue_api_key(db_session, tenant_id="acme", name="i", scope="internal")

    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    with TestClient(_scoped_app(db_engine)) as client:
        refused = client.post("/things", headers=auth(read))
        assert refused.status_code == 403
        assert refused.json()["detail"] == (
            "this API key has scope 'read'; POST /things needs a key with scope 'write'"
        )
        assert client.post("/things", headers=auth(internal)).status_code == 403
        assert client.post("/things", headers=auth(write)).json() == {"changed": True}
        assert client.post("/things").status_code == 401  # no key: still 401, not 403

        assert client.get("/by-method", headers=auth(read)).json() == {"scope": "read"}
        assert client.delete("/by-method", headers=auth(read)).status_code == 403
        assert client.delete("/by-method", headers=auth(write)).json() == {"scope": "write"}


def test_require_scope_refuses_a_scope_that_does_not_exist() -> None:
    with pytest.raises(ValueError, match="require_scope: give one or more of read, write"):
        require_scope("owner")  # type: ignore[arg-type]
