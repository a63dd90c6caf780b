"""Who holds which owned machine, and which host key each address proved it has.

A claim is one row keyed by the host's name: the INSERT that lands first wins, on SQLite (one
writer at a time) and PostgreSQL (unique index) alike, across threads, processes and workers
that share the database. A host with a claim row is never offered; deleting the row (delete)
frees it. `ssh_claim_log` remembers every (vm, host) ever claimed so cleanup can reach the
machine after the claim is gone. `ssh_host_keys` pins the first key each address presents.

These tables belong to the ssh provider, not to gpuprov's schema (no Alembic migration): they
are created on first use, in whatever database `claims_url` names.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

metadata = sa.MetaData()
_CLAIM_ROUNDS = 3

claims = sa.Table(
    "ssh_claims",
    metadata,
    sa.Column("host", sa.String(64), primary_key=True),
    sa.Column("vm", sa.String(200), nullable=False, index=True),
    sa.Column("region", sa.String(64), nullable=False),
    sa.Column("claimed_at", sa.Float, nullable=False),
)
claim_log = sa.Table(
    "ssh_claim_log",
    metadata,
    sa.Column("vm", sa.String(200), primary_key=True),
    sa.Column("host", sa.String(64), primary_key=True),
    sa.Column("region", sa.String(64), nullable=False),
    sa.Column("claimed_at", sa.Float, nullable=False),
    # observe saw the host reachable while this VM held it: only then can anything (the
    # bootstrap comes after Running) have been installed there for the VM.
    sa.Column("reached", sa.Boolean, nullable=False, default=False),
)
host_keys = sa.Table(
    "ssh_host_keys",
    metadata,
    sa.Column("address", sa.String(300), primary_key=True),  # host:port
    sa.Column("public_key", sa.Text, nullable=False),
    sa.Column("pinned_at", sa.Float, nullable=False),
)


def _engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if not parsed.drivername.startswith("sqlite"):
        return sa.create_engine(parsed, pool_pre_ping=True)
    options: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30}}
    if not parsed.database or parsed.database == ":memory:":
        options["poolclass"] = sa.StaticPool
    else:
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(parsed, **options)

    @sa.event.listens_for(engine, "connect")
    def _pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    return engine


class ClaimStore:
    """Synchronous (a database): async callers wrap calls in asyncio.to_thread."""

    def __init__(self, url: str) -> None:
        self.engine = _engine(url)
        try:
            metadata.create_all(self.engine)
        except (OperationalError, ProgrammingError, IntegrityError):
            # Another process created the tables between our check and our CREATE.
            metadata.create_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ claims

    def claim(self, host: str, vm: str, region: str) -> str:
        """Claim `host` for `vm`; returns the VM that holds it afterwards (`vm` if we won or
        already held it: a retried create is idempotent)."""
        for _ in range(_CLAIM_ROUNDS):
            now = time.time()
            try:
                with self.engine.begin() as connection:
                    connection.execute(
                        claims.insert().values(host=host, vm=vm, region=region, claimed_at=now)
                    )
                    self._log(connection, vm, host, region, now)
            except IntegrityError:
                pass  # someone holds it (maybe us, from an earlier attempt)
            holder = self.holder(host)
            if holder is not None:
                return holder
            # Released between our INSERT and our read: try again.
        raise RuntimeError(f"claim of {host} kept racing with releases")

    def _log(self, connection: sa.Connection, vm: str, host: str, region: str, now: float) -> None:
        known = connection.execute(
            sa.select(claim_log.c.vm).where(claim_log.c.vm == vm, claim_log.c.host == host)
        ).first()
        if known is None:
            connection.execute(
                claim_log.insert().values(
                    vm=vm, host=host, region=region, claimed_at=now, reached=False
                )
            )

    def holder(self, host: str) -> str | None:
        with self.engine.connect() as connection:
            return connection.execute(
                sa.select(claims.c.vm).where(claims.c.host == host)
            ).scalar_one_or_none()

    def held(self) -> dict[str, str]:
        """host -> the VM holding it."""
        with self.engine.connect() as connection:
            rows = connection.execute(sa.select(claims.c.host, claims.c.vm)).all()
        return {host: vm for host, vm in rows}

    def held_in(self, region: str, vm: str | None = None) -> dict[str, list[str]]:
        """vm -> the hosts it holds in `region` (only `vm`'s when given), sorted."""
        query = sa.select(claims.c.vm, claims.c.host).where(claims.c.region == region)
        if vm is not None:
            query = query.where(claims.c.vm == vm)
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(claims.c.vm, claims.c.host)).all()
        held: dict[str, list[str]] = {}
        for holder, host in rows:
            held.setdefault(holder, []).append(host)
        return held

    def release(self, vm: str, region: str, hosts: list[str] | None = None) -> list[str]:
        """Drop `vm`'s claims in `region` (only `hosts` when given); a claim held by another VM
        is never touched. Returns the hosts freed."""
        where = [claims.c.vm == vm, claims.c.region == region]
        if hosts is not None:
            where.append(claims.c.host.in_(hosts))
        with self.engine.begin() as connection:
            freed = connection.execute(sa.select(claims.c.host).where(*where)).scalars().all()
            connection.execute(claims.delete().where(*where))
        return sorted(freed)

    def mark_reached(self, vm: str, host: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                claim_log.update()
                .where(claim_log.c.vm == vm, claim_log.c.host == host)
                .values(reached=True)
            )

    def hosts_used_by(self, vm: str, region: str, reached_only: bool = False) -> list[str]:
        """Every host `vm` ever claimed in `region`, held or released (with `reached_only`,
        those observe found reachable while `vm` held them)."""
        query = sa.select(claim_log.c.host).where(
            claim_log.c.vm == vm, claim_log.c.region == region
        )
        if reached_only:
            query = query.where(claim_log.c.reached.is_(True))
        with self.engine.connect() as connection:
            return sorted(connection.execute(query).scalars().all())

    # ------------------------------------------------------------------ host keys

    def pinned_key(self, address: str) -> str | None:
        with self.engine.connect() as connection:
            return connection.execute(
                sa.select(host_keys.c.public_key).where(host_keys.c.address == address)
            ).scalar_one_or_none()

    def pin(self, address: str, public_key: str) -> str:
        """Record `public_key` for `address` unless one is recorded; returns the recorded one."""
        try:
            with self.engine.begin() as connection:
                connection.execute(
                    host_keys.insert().values(
                        address=address, public_key=public_key, pinned_at=time.time()
                    )
                )
        except IntegrityError:
            pass
        recorded = self.pinned_key(address)
        assert recorded is not None
        return recorded

    def unpin(self, address: str) -> bool:
        """Forget a pinned key (an operator who re-installed a machine on purpose)."""
        with self.engine.begin() as connection:
            result = connection.execute(host_keys.delete().where(host_keys.c.address == address))
        return result.rowcount > 0
