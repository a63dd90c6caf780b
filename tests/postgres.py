"""A real PostgreSQL 15 for the test session, started from the installed server binaries.

initdb runs once per session into a fresh directory under /tmp; the server listens on a free
loopback port (and a Unix socket in that same directory, so nothing under /var/run is needed) and
is stopped with `pg_ctl stop -m fast` at the end. PostgreSQL refuses to run as root, so when the
suite runs as root (as CI does) initdb and pg_ctl run as the `postgres` system user through
`su postgres -s /bin/bash -c ...`, on a directory that user owns.

Missing binaries or a missing `postgres` user fail the PostgreSQL tests with a message; they are
never skipped, because CI requires the database suite to pass on both engines.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

PG_BIN = Path(os.environ.get("GPUPROV_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"  # the system user that runs the server when we are root
# Durability is irrelevant to a throwaway test server; turning it off keeps CREATE DATABASE fast.
SERVER_OPTIONS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_as_server_user(args: list[str], *, cwd: Path, timeout: float = 120) -> None:
    command = args
    if os.geteuid() == 0:
        command = ["su", PG_USER, "-s", "/bin/bash", "-c", shlex.join(args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )


def _require_server() -> None:
    missing = [name for name in ("initdb", "pg_ctl", "postgres") if not (PG_BIN / name).exists()]
    if missing:
        pytest.fail(
            f"PostgreSQL 15 server binaries not found in {PG_BIN} (missing {', '.join(missing)}); "
            "install postgresql-15 (the database suite must pass on PostgreSQL too)",
            pytrace=False,
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            pytest.fail(
                f"running as root but there is no {PG_USER!r} system user to run PostgreSQL as "
                "(PostgreSQL refuses to run as root)",
                pytrace=False,
            )


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a database `gpuprov` on a session-wide PostgreSQL server (superuser, trust auth)."""
    _require_server()
    root = Path(tempfile.mkdtemp(prefix="gpuprov-pg-", dir="/tmp"))
    root.chmod(0o700)
    if os.geteuid() == 0:
        server_user = pwd.getpwnam(PG_USER)
        os.chown(root, server_user.pw_uid, server_user.pw_gid)
    data, log = root / "data", root / "server.log"
    port = _free_port()
    pg_ctl = str(PG_BIN / "pg_ctl")
    try:
        _run_as_server_user(
            [str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"]
            + ["-E", "UTF8", "--locale=C", "--no-sync"],
            cwd=root,
        )
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} {SERVER_OPTIONS}"
        _run_as_server_user(
            [pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "start"], cwd=root
        )
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        detail = log.read_text() if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {error}\n{detail}", pytrace=False)
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}"
        admin = sa.create_engine(f"{url}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.exec_driver_sql("CREATE DATABASE gpuprov")
        admin.dispose()
        yield f"{url}/gpuprov"
    finally:
        _run_as_server_user([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], cwd=root)
        shutil.rmtree(root, ignore_errors=True)


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
