"""Database fixtures: every storage test runs on SQLite and on PostgreSQL, both migrated to head.

SQLite: the session migrates one template file; each test gets a copy of it (fast, isolated).
PostgreSQL: the server at TUNELOOP_TEST_POSTGRES_URL (default: the CI server, trust auth). The
session creates a uniquely named database, migrates it, empties its tables after each test and
drops it at the end. When the server is unreachable the postgres tests skip and say why.

    def test_something(db_engine: Engine) -> None:      # runs as [sqlite] and [postgres]
    def test_migrations(blank_database_url: URL) -> None:  # an empty, unmigrated database
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlmodel import Session

from shared.db import make_engine, migrate

POSTGRES_URL_ENV = "TUNELOOP_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class PostgresServer:
    """Creates throw-away databases on one server and drops them all at the end."""

    def __init__(self, admin_url: URL) -> None:
        self.admin_url = admin_url
        # CREATE/DROP DATABASE refuse to run inside a transaction.
        self._admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        self._created: list[str] = []

    def check_reachable(self) -> None:
        try:
            with self._admin.connect() as connection:
                connection.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            where = f"{self.admin_url.host}:{self.admin_url.port or 5432}"
            pytest.skip(f"PostgreSQL at {where} unreachable: {reason}")

    def create_database(self) -> URL:
        name = f"tuneloop_test_{uuid4().hex[:12]}"
        with self._admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        self._created.append(name)
        return self.admin_url.set(database=name)

    def drop_all(self) -> None:
        with self._admin.connect() as connection:
            for name in self._created:
                # FORCE: a test that leaked a connection must not leave its database behind.
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self._created.clear()
        self._admin.dispose()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    url = make_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
    if "connect_timeout" not in url.query:
        url = url.update_query_dict({"connect_timeout": "3"})
    server = PostgresServer(url)
    server.check_reachable()
    yield server
    server.drop_all()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> URL:
    """The session's migrated PostgreSQL database."""
    url = postgres_server.create_database()
    migrate(url)
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "tuneloop.db"
    migrate(f"sqlite:///{path}")  # disposes its engine, so the WAL is folded back into the file
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> URL:
    """A migrated SQLite file of the test's own."""
    path = tmp_path / "tuneloop.db"
    shutil.copyfile(sqlite_template, path)
    return make_url(f"sqlite:///{path}")


def _empty_tables(engine: Engine) -> None:
    names = [name for name in inspect(engine).get_table_names() if name != "alembic_version"]
    if not names:
        return
    quote = engine.dialect.identifier_preparer.quote
    with engine.begin() as connection:
        connection.execute(
            text(f"TRUNCATE {', '.join(map(quote, names))} RESTART IDENTITY CASCADE")
        )


@pytest.fixture(params=BACKENDS)
def db_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine on a migrated database, once per backend; the test sees no rows of other tests."""
    url: URL = request.getfixturevalue(f"{request.param}_url")
    engine = make_engine(url)
    try:
        yield engine
        if request.param == "postgres":
            _empty_tables(engine)
    finally:
        engine.dispose()


@pytest.fixture
def db_session(db_engine: Engine) -> Iterator[Session]:
    with Session(db_engine) as session:
        yield session


@pytest.fixture(params=BACKENDS)
def blank_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> URL:
    """An empty database without any migration applied, once per backend."""
    if request.param == "sqlite":
        return make_url(f"sqlite:///{tmp_path / 'blank.db'}")
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database()
