"""The database kernel on SQLite and PostgreSQL: migrations, engines, sessions, readiness, CLI."""

import re
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import IntegrityError, StatementError
from sqlmodel import Session, SQLModel, select

from shared import db
from shared.auth import ApiKey, Tenant
from shared.db import (
    DatabaseUnavailableError,
    SessionDep,
    current_revisions,
    downgrade,
    head_revisions,
    import_table_modules,
    main,
    make_engine,
    migrate,
    migration_connection,
    session_scope,
    wait_until_ready,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
AUTH_TABLES = {"auth_tenants", "auth_api_keys", "auth_webhook_nonces"}


def _tables(url: str | URL) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _unreachable_postgres_url(password: str) -> str:
    return f"postgresql+psycopg://tuneloop:{password}@127.0.0.1:{_closed_port()}/tuneloop"


# --- migrations -------------------------------------------------------------------------------


def test_migrations_apply_and_reach_head(blank_database_url: URL) -> None:
    assert current_revisions(blank_database_url) == set()

    migrate(blank_database_url)

    assert current_revisions(blank_database_url) == head_revisions()
    assert head_revisions(), "there is at least one migration"
    assert _tables(blank_database_url) >= AUTH_TABLES | {"alembic_version"}


def test_downgrade_to_base_and_upgrade_again(blank_database_url: URL) -> None:
    migrate(blank_database_url)

    downgrade(blank_database_url, revision="base")
    assert current_revisions(blank_database_url) == set()
    assert _tables(blank_database_url) & AUTH_TABLES == set()

    migrate(blank_database_url)
    assert current_revisions(blank_database_url) == head_revisions()
    engine = make_engine(blank_database_url)
    try:
        with session_scope(engine) as session:
            session.add(Tenant(id="after-round-trip", name="Round trip"))
        with Session(engine) as session:
            assert session.get(Tenant, "after-round-trip") is not None
    finally:
        engine.dispose()


def test_replicas_migrating_at_once_take_turns(blank_database_url: URL) -> None:
    # Processes, not threads: Alembic's `context` is process-global. This also covers `-m`.
    url = blank_database_url.render_as_string(hide_password=False)
    command = [sys.executable, "-m", "shared.db", "--url", url, "upgrade"]
    replicas = [
        subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    errors = [replica.communicate(timeout=120)[1] for replica in replicas]

    assert [replica.returncode for replica in replicas] == [0, 0, 0], errors
    assert current_revisions(blank_database_url) == head_revisions()


def test_sqlite_batch_migration_keeps_child_rows(sqlite_url: URL) -> None:
    # SQLite batch mode drops and recreates a table; with foreign keys on during the migration,
    # dropping auth_tenants would cascade-delete every API key.
    engine = make_engine(sqlite_url)
    try:
        with session_scope(engine) as session:
            session.add(Tenant(id="acme", name="Acme"))
            session.flush()  # no ORM relationship orders the inserts
            session.add(ApiKey(tenant_id="acme", name="k", prefix="abcd1234", key_hash="0" * 64))

        with migration_connection(sqlite_url) as connection:
            operations = Operations(MigrationContext.configure(connection))
            with operations.batch_alter_table("auth_tenants", recreate="always") as batch:
                batch.alter_column("name", existing_type=sa.String(200), type_=sa.String(300))

        with Session(engine) as session:
            assert [key.tenant_id for key in session.exec(select(ApiKey)).all()] == ["acme"]
        with engine.connect() as connection:  # ordinary connections enforce keys again
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_a_failed_sqlite_migration_rolls_back(sqlite_url: URL) -> None:
    def create_then_fail() -> None:
        with migration_connection(sqlite_url) as connection:
            connection.exec_driver_sql("CREATE TABLE half_done (id INTEGER PRIMARY KEY)")
            raise RuntimeError("migration step failed")

    with pytest.raises(RuntimeError, match="migration step failed"):
        create_then_fail()
    assert "half_done" not in _tables(sqlite_url)


def test_table_models_match_the_migrations(db_engine: Engine) -> None:
    # A table or column added to a model without a migration shows up here.
    import_table_modules()
    with db_engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    assert differences == []


def test_import_table_modules_loads_the_kernel_and_every_registered_service() -> None:
    modules = import_table_modules()
    assert {"shared.auth", "shared.signing"} <= set(modules)
    registered = db.registered_table_modules()
    assert registered  # each service with tables registers its module (pyproject.toml)
    for name, module in registered.items():
        assert module == f"services.{name}.models"
        assert module in modules
        assert module in sys.modules


def test_the_kernel_names_no_service() -> None:
    for path in (Path(db.__file__), db.MIGRATIONS_DIR / "env.py"):
        assert not re.search(r"services\.\w", path.read_text()), path


def test_no_registered_tables_refuses_to_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """An install predating the registrations would make autogenerate drop every service table."""
    monkeypatch.setattr(db, "entry_points", lambda group: [])
    with pytest.raises(RuntimeError, match="make install"):
        import_table_modules()


# --- engines and sessions ---------------------------------------------------------------------


def test_sqlite_connections_use_wal_foreign_keys_and_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "tuneloop.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    finally:
        engine.dispose()
    assert path.exists()


def test_foreign_keys_are_enforced(db_engine: Engine) -> None:
    orphan = ApiKey(tenant_id="nobody", name="orphan", prefix="abcd1234", key_hash="0" * 64)
    with pytest.raises(IntegrityError), session_scope(db_engine) as session:
        session.add(orphan)


def test_session_scope_commits_on_success_and_rolls_back_on_error(db_engine: Engine) -> None:
    with session_scope(db_engine) as session:
        session.add(Tenant(id="kept", name="Kept"))

    def add_then_fail() -> None:
        with session_scope(db_engine) as session:
            session.add(Tenant(id="dropped", name="Dropped"))
            session.flush()  # the row reached the database, inside the transaction
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        add_then_fail()

    with Session(db_engine) as session:
        assert list(session.exec(select(Tenant.id)).all()) == ["kept"]


def test_datetimes_come_back_aware_utc_and_naive_ones_are_refused(db_engine: Engine) -> None:
    created = datetime(2030, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    with session_scope(db_engine) as session:
        session.add(Tenant(id="zoned", name="Zoned", created_at=created))
    with Session(db_engine) as session:
        stored = session.get(Tenant, "zoned")
        assert stored is not None
        assert stored.created_at.tzinfo == UTC
        assert stored.created_at == created  # the same instant

    naive = Tenant(id="naive", name="Naive", created_at=datetime(2030, 5, 1))
    with pytest.raises(StatementError, match="naive datetime"), session_scope(db_engine) as session:
        session.add(naive)


def test_the_session_dependency_serves_requests(db_engine: Engine) -> None:
    with session_scope(db_engine) as session:
        session.add(Tenant(id="acme", name="Acme"))
    app = FastAPI()
    app.state.db_engine = db_engine

    @app.get("/via-state")
    def via_state(session: SessionDep) -> list[str]:
        return list(session.exec(select(Tenant.id)).all())

    with TestClient(app) as client:
        assert client.get("/via-state").json() == ["acme"]


def test_missing_engine_on_app_state_is_explained() -> None:
    app = FastAPI()

    @app.get("/")
    def route(session: SessionDep) -> None:
        return None

    with TestClient(app) as client, pytest.raises(RuntimeError, match=r"app\.state\.db_engine"):
        client.get("/")


# --- readiness --------------------------------------------------------------------------------


def test_wait_until_ready_returns_once_the_database_answers(db_engine: Engine) -> None:
    wait_until_ready(db_engine, timeout_s=10)
    with db_engine.connect() as connection:
        assert connection.execute(text("SELECT 1")).scalar() == 1


def test_unreachable_database_fails_with_one_line_naming_host_not_password() -> None:
    url = _unreachable_postgres_url(password="s3cret-pw")
    engine = make_engine(url)
    try:
        with pytest.raises(DatabaseUnavailableError) as caught:
            wait_until_ready(engine, timeout_s=0.5)
    finally:
        engine.dispose()
    message = str(caught.value)
    assert message.startswith(f"database postgresql at 127.0.0.1:{engine.url.port}/tuneloop")
    assert "not ready after 0.5s" in message
    assert "s3cret-pw" not in message
    assert "\n" not in message


# --- CLI --------------------------------------------------------------------------------------


def test_cli_upgrade_then_current_reports_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    (head,) = head_revisions()

    assert main(["--url", url, "current"]) == 0
    assert f"empty (no migration applied) (behind; head is {head})" in capsys.readouterr().out
    assert main(["--url", url, "upgrade"]) == 0
    assert main(["--url", url, "current"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{head} (head)"


def test_cli_reports_an_unreachable_database_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = _unreachable_postgres_url(password="s3cret-pw")

    assert main(["--url", url, "--timeout", "0.5", "upgrade"]) == 1

    err = capsys.readouterr().err.strip()
    assert err.startswith("error: database postgresql at 127.0.0.1:")
    assert "s3cret-pw" not in err
    assert len(err.splitlines()) == 1
