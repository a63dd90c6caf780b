"""The scratch PostgreSQL database of `python -m chaos --database postgresql`.

Either the harness runs its own server: `initdb` into a fresh directory, then `postgres` in the
foreground as a child it owns (processes.py: it dies with the harness), listening on a free
loopback port, from the binaries in $GPUPROV_PG_BIN (default /usr/lib/postgresql/15/bin), as
the `postgres` system user when the harness is root (PostgreSQL refuses to run as root). Or it
is given a server (`--postgres-url`, a role that may CREATE DATABASE) and makes a fresh database
there. Either way the workers, the API and the checks all use that one database, and it is gone
at the end (the directory is kept with --keep; a given server's database is dropped anyway).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from chaos.processes import STOP_GRACE, Child, preexec
from gpuprov.cli.dev import free_port

PG_BIN = Path(os.environ.get("GPUPROV_PG_BIN", "/usr/lib/postgresql/15/bin"))
SERVER_USER = "postgres"
# A throwaway server: durability is irrelevant, and skipping fsync keeps it off the disk.
OPTIONS = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
READY_TIMEOUT = 60.0


class ScratchPostgres:
    """One scratch database: `await start()` gives its URL, `stop()` removes it."""

    def __init__(self, server_url: str | None = None, keep: bool = False) -> None:
        self.server_url = server_url
        self.keep = keep
        self.root: Path | None = None
        self.server: Child | None = None
        self.url: str | None = None

    async def start(self) -> str:
        if self.server_url is None:
            self.server_url = await self._own_server()
        admin = _psycopg(self.server_url)
        name = f"chaos_{uuid.uuid4().hex[:12]}"
        await asyncio.to_thread(_execute, admin, f'CREATE DATABASE "{name}"')
        self.url = admin.set(database=name).render_as_string(hide_password=False)
        return self.url

    def stop(self) -> None:
        """Drop the database (a given server) or stop and remove the server (our own)."""
        if self.server is not None:
            proc = self.server.proc
            if proc is not None and proc.poll() is None:
                # SIGINT is PostgreSQL's fast shutdown: it does not wait for clients to leave.
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    self.server.kill()
            if self.root is not None and not self.keep:
                shutil.rmtree(self.root, ignore_errors=True)
        elif self.server_url is not None and self.url is not None:
            name = sa.make_url(self.url).database
            _execute(_psycopg(self.server_url), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def describe(self) -> str:
        where = "a server of its own" if self.server is not None else "the given server"
        database = sa.make_url(self.url).database if self.url else "?"
        return f"PostgreSQL database {database} on {where}"

    async def _own_server(self) -> str:
        missing = [name for name in ("initdb", "postgres") if not (PG_BIN / name).exists()]
        if missing:
            raise RuntimeError(
                f"PostgreSQL server binaries not found in {PG_BIN} (missing "
                f"{', '.join(missing)}): install postgresql-15, set GPUPROV_PG_BIN, or give "
                "--postgres-url"
            )
        user = pwd.getpwnam(SERVER_USER) if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="gpuprov-chaos-pg-", dir="/tmp"))
        if user is not None:
            os.chown(self.root, user.pw_uid, user.pw_gid)
        data = self.root / "data"
        await asyncio.to_thread(_initdb, data, self.root, user)
        port = free_port()
        args = [str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port)]
        args += ["-c", "listen_addresses=127.0.0.1", "-k", str(self.root), *OPTIONS]
        self.server = Child("postgres", args, self.root / "server.log", user=user)
        self.server.start()
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        await self._wait_ready(sa.make_url(url))
        return url

    async def _wait_ready(self, url: sa.URL) -> None:
        assert self.server is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if not self.server.running:
                raise RuntimeError(f"postgres exited:\n{self.server.log_tail()}")
            try:
                await asyncio.to_thread(_execute, url, "SELECT 1")
                return
            except sa.exc.OperationalError as error:
                if time.monotonic() > deadline:
                    message = f"postgres did not answer in {READY_TIMEOUT:g}s: {error}"
                    raise RuntimeError(message) from None
            await asyncio.sleep(0.2)


def _initdb(data: Path, cwd: Path, user: pwd.struct_passwd | None) -> None:
    args = [str(PG_BIN / "initdb"), "-D", str(data), "-U", SERVER_USER, "-A", "trust"]
    args += ["-E", "UTF8", "--locale=C", "--no-sync"]
    result = subprocess.run(
        args, capture_output=True, text=True, cwd=cwd, timeout=120, preexec_fn=preexec(user)
    )
    if result.returncode != 0:
        raise RuntimeError(f"initdb failed ({result.returncode}): {result.stderr[-2000:]}")


def _psycopg(url: str) -> sa.URL:
    """The URL as SQLAlchemy must read it: psycopg 3 is the driver installed."""
    parsed = sa.make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _execute(url: sa.URL, statement: str) -> None:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(statement)
    finally:
        engine.dispose()
