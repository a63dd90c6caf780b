"""A throwaway PostgreSQL 15 from the installed server binaries, for the scenarios that need
several processes on one database (and for the test suite's session server, tests/postgres.py).

`running_postgres()` runs initdb into a fresh directory under /tmp, starts the server on a free
loopback port (and a Unix socket in that directory, so nothing under /var/run is needed),
creates the database `gpuprov`, yields its URL and stops the server with `pg_ctl stop -m fast`.
PostgreSQL refuses to run as root, so as root initdb and pg_ctl run as the `postgres` system
user (`su postgres -s /bin/bash -c ...`) on a directory that user owns. Durability is off: the
data is thrown away.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

PG_BIN = Path(os.environ.get("GPUPROV_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"  # the system user that runs the server when we are root
# Durability is irrelevant to a throwaway server; turning it off keeps CREATE DATABASE fast.
SERVER_OPTIONS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
MAX_CONNECTIONS = 300  # two API processes' pools, a sweep and the suite's scratch databases


class PostgresMissing(RuntimeError):
    """The server binaries, or the system user to run them as root, are not here."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_as_server_user(args: list[str], *, cwd: Path, timeout: float = 120) -> None:
    command = args
    if os.geteuid() == 0:
        command = ["su", PG_USER, "-s", "/bin/bash", "-c", shlex.join(args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )


def missing_server() -> str | None:
    """Why no server can be started here, or None."""
    missing = [name for name in ("initdb", "pg_ctl", "postgres") if not (PG_BIN / name).exists()]
    if missing:
        return (
            f"PostgreSQL 15 server binaries not found in {PG_BIN} (missing {', '.join(missing)}); "
            "install postgresql-15"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            return (
                f"running as root but there is no {PG_USER!r} system user to run PostgreSQL as "
                "(PostgreSQL refuses to run as root)"
            )
    return None


@contextmanager
def running_postgres() -> Iterator[str]:
    """The URL of a database `gpuprov` on a fresh server (superuser, trust auth, loopback).
    PostgresMissing when it cannot run here; RuntimeError (with the server's log) when it
    would not start."""
    why = missing_server()
    if why:
        raise PostgresMissing(why)
    root = Path(tempfile.mkdtemp(prefix="gpuprov-pg-", dir="/tmp"))
    root.chmod(0o700)
    if os.geteuid() == 0:
        server_user = pwd.getpwnam(PG_USER)
        os.chown(root, server_user.pw_uid, server_user.pw_gid)
    data, log = root / "data", root / "server.log"
    port = _free_port()
    pg_ctl = str(PG_BIN / "pg_ctl")
    try:
        run_as_server_user(
            [str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"]
            + ["-E", "UTF8", "--locale=C", "--no-sync"],
            cwd=root,
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {root} {SERVER_OPTIONS} "
            f"-c max_connections={MAX_CONNECTIONS}"
        )
        run_as_server_user(
            [pg_ctl, "-D", str(data), "-l", str(log), "-o", options, "-w", "start"], cwd=root
        )
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        detail = log.read_text() if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {error}\n{detail}") from None
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}"
        admin = sa.create_engine(f"{url}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.exec_driver_sql("CREATE DATABASE gpuprov")
        admin.dispose()
        yield f"{url}/gpuprov"
    finally:
        run_as_server_user([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], cwd=root)
        shutil.rmtree(root, ignore_errors=True)
