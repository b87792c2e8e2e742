"""`tuneloop keys create|list|revoke` against a SQLite database of the test's own (a real file,
migrated by the command itself). The printed key at work on a real ingest service:
tests/services/ingest/test_scopes.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, select
from typer.testing import CliRunner, Result

from shared import auth, db
from shared.dev.cli import app
from shared.settings import get_settings


@pytest.fixture
def database_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    monkeypatch.setenv("TUNELOOP_DATABASE_URL", url)
    monkeypatch.setenv("TUNELOOP_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TUNELOOP_INGEST_PORT", "18400")
    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


def _run(*args: str) -> Result:
    return CliRunner().invoke(app, ["keys", *args])


def _stored_keys(url: str) -> list[auth.ApiKey]:
    engine = db.make_engine(url)
    try:
        with Session(engine) as session:
            return list(session.exec(select(auth.ApiKey)).all())
    finally:
        engine.dispose()


def test_create_makes_the_tenant_and_prints_the_key_once_with_the_base_url(
    database_url: str,
) -> None:
    result = _run("create", "--tenant", "acme", "--scope", "read")

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "created tenant acme"
    [key] = [line for line in lines if auth.KEY_PATTERN.fullmatch(line)]
    assert "base URL: http://127.0.0.1:18400/v1" in lines
    assert any(line.startswith("use: OPENAI_BASE_URL=http://127.0.0.1:18400/v1") for line in lines)
    [stored] = _stored_keys(database_url)
    assert (stored.tenant_id, stored.scope, stored.key_hash) == ("acme", "read", auth.hash_key(key))

    again = _run("create", "--tenant", "acme", "--name", "ci")  # tenant exists: just a key
    assert again.exit_code == 0, again.output
    assert "created tenant" not in again.output
    assert [(k.name, k.scope) for k in _stored_keys(database_url)] == [
        ("read key", "read"),
        ("ci", "write"),
    ]


def test_create_as_json_for_scripts(database_url: str) -> None:
    result = _run("create", "--tenant", "acme", "--scope", "internal", "--json")

    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["scope"] == "internal"
    assert printed["base_url"] == "http://127.0.0.1:18400/v1"
    assert auth.KEY_PATTERN.fullmatch(printed["key"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tenant", "Acme Corp"), "--tenant: 'Acme Corp' must be 1-63 lowercase letters"),
        (("--tenant", "acme", "--scope", "owner"), "--scope: 'owner' is not one of read, write"),
    ],
)
def test_create_refuses_bad_arguments_by_name(
    database_url: str, args: tuple[str, ...], message: str
) -> None:
    result = _run("create", *args)

    assert result.exit_code == 2
    assert message in result.output
    assert _stored_keys(database_url) == []


def test_list_shows_prefixes_and_scopes_never_keys(database_url: str) -> None:
    created = json.loads(_run("create", "--tenant", "acme", "--json").output)

    listing = _run("list", "--tenant", "acme")

    assert listing.exit_code == 0, listing.output
    assert created["id"] in listing.output
    assert f"tl_{created['prefix']}_" in listing.output
    assert "write" in listing.output
    assert created["key"] not in listing.output
    assert created["key"].split("_", 2)[2][:12] not in listing.output
    unknown = _run("list", "--tenant", "globex")
    assert unknown.exit_code == 1
    assert "--tenant: tenant 'globex' does not exist" in unknown.output


def test_revoke_stops_the_key_and_another_tenants_key_is_not_found(database_url: str) -> None:
    created = json.loads(_run("create", "--tenant", "acme", "--json").output)
    _run("create", "--tenant", "globex")

    assert _run("revoke", "--tenant", "globex", created["id"]).exit_code == 1
    revoked = _run("revoke", "--tenant", "acme", created["id"])

    assert revoked.exit_code == 0, revoked.output
    assert f"revoked key {created['id']}" in revoked.output
    engine = db.make_engine(database_url)
    try:
        with Session(engine) as session, pytest.raises(auth.RevokedKeyError):
            auth.authenticate(session, created["key"])
    finally:
        engine.dispose()
