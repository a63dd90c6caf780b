"""A real PostgreSQL 15 for the test session, started from the installed server binaries by
bench/postgres.py (initdb once per session under /tmp, a free loopback port, `pg_ctl stop -m
fast` at the end; as root, run as the `postgres` system user), and a fresh database per test.

Missing binaries or a missing `postgres` user fail the PostgreSQL tests with a message; they are
never skipped, because CI requires the database suite to pass on both engines.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from bench.postgres import PostgresMissing, running_postgres


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a database `gpuprov` on a session-wide PostgreSQL server (superuser, trust auth)."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(running_postgres())
        except PostgresMissing as missing:
            pytest.fail(f"{missing}: the database suite must pass on it too", pytrace=False)
        except RuntimeError as error:
            pytest.fail(str(error), pytrace=False)
        yield url


class ScratchDatabases:
    """CREATE DATABASE / DROP DATABASE on the session server, one fresh database per test."""

    def __init__(self, server_url: str) -> None:
        self._base = sa.make_url(server_url)
        self._admin = sa.create_engine(
            self._base.set(database="postgres"), isolation_level="AUTOCOMMIT"
        )

    def create(self) -> str:
        name = f"test_{uuid.uuid4().hex[:16]}"
        with self._admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        return self._base.set(database=name).render_as_string(hide_password=False)

    def drop(self, url: str) -> None:
        name = sa.make_url(url).database
        with self._admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def dispose(self) -> None:
        self._admin.dispose()


@pytest.fixture(scope="session")
def postgres_scratch(postgres_url: str) -> Iterator[ScratchDatabases]:
    scratch = ScratchDatabases(postgres_url)
    yield scratch
    scratch.dispose()
