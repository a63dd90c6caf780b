"""The control plane's database: sqlmodel tables and the engine around them.

SQLite (a file under `.data/`) is the embedded default; PostgreSQL (psycopg 3) is for production.
Tables are created only by the Alembic migrations in `migrations/` beside it (`Database.upgrade`),
never by `metadata.create_all`, so a production schema always has a known revision.

Every timestamp is a timezone-aware UTC datetime in Python. PostgreSQL stores `timestamptz`;
SQLite has no time zones, so `UtcDateTime` stores naive UTC there and re-attaches UTC on read.
`gpuprov.store.records.Records` is the only code that reads and writes these tables, but for the
credential tables (operator_keys, worker_credentials), which are gpuprov.store.credentials', and the
SSH key tables (ssh_host_keys, ssh_client_keys), which are gpuprov.store.ssh_records'.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Dialect, Engine, make_url
from sqlalchemy.orm import registry
from sqlmodel import Field, Session, SQLModel

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

VM_STATUSES = ("recorded", "created", "running", "terminating", "terminated", "orphaned", "kept")
COST_KINDS = ("estimate", "actual")
BLOCK_SCOPES = ("offer", "region", "provider")
WORKER_ORIGINS = ("managed", "existing")
WORKER_STATES = ("idle", "reserved", "busy", "revoked")
WORK_STATES = ("assigned", "started", "exited", "stop_requested", "stopped", "abandoned")
LOG_STREAMS = ("stdout", "stderr", "gpuprov")  # gpuprov: the control plane's own notes
SSH_CLIENT_KEY_SOURCES = ("configured", "generated")
WORKER_LIVENESS = ("alive", "lost")  # lost: no heartbeat for [workers] lost_after_seconds
WORKER_HEALTH = ("healthy", "unhealthy")  # the node's latest GPU verdict
ROLES = ("admin", "member", "viewer")  # an operator key's role, most powerful first
ON_EXCEED = ("release", "warn")  # a running job that crosses its team's monthly budget


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every dialect; naive datetimes are refused."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: gpuprov stores only aware UTC times")
        value = value.astimezone(UTC)
        # SQLite's DATETIME text drops the offset anyway; store naive UTC so it compares as text.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Explicit names everywhere else; primary keys get the same name on SQLite and PostgreSQL.
_NAMING = {"pk": "pk_%(table_name)s"}


def _time(*, nullable: bool = False) -> Any:
    return Field(sa_column=sa.Column(UtcDateTime(), nullable=nullable))


def _json(*, nullable: bool = False) -> Any:
    return Field(sa_column=sa.Column(sa.JSON(), nullable=nullable))


def _text(*, nullable: bool = False) -> Any:
    return Field(sa_column=sa.Column(sa.Text(), nullable=nullable))


def _with_default(column_type: Any, default: Any, server_default: Any) -> Any:
    """A NOT NULL column that rows written before it existed get a value for."""
    column = sa.Column(column_type, nullable=False, server_default=server_default)
    return Field(default=default, sa_column=column)


# The run of its job a row belongs to: the job's run tag (workflows/attempt.py `vm_run_tag`,
# also the end of its VM identities). "" for a row written before runs were recorded, whose
# run could not be told from its VM identity (gpuprov/store/runs.py).
NO_RUN = ""


def _run() -> Any:
    return _with_default(sa.String(), NO_RUN, NO_RUN)


class Table(SQLModel, registry=registry(metadata=sa.MetaData(naming_convention=_NAMING))):
    """Base of gpuprov's tables: its own registry, so `metadata` holds exactly our tables."""


metadata = Table.metadata


class VmRecord(Table, table=True):
    """One instance per node per attempt, recorded *before* the create call."""

    __tablename__ = "vms"
    __table_args__ = (
        sa.UniqueConstraint("vm", name="uq_vms_vm"),
        sa.Index("ix_vms_job", "job"),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    job: str
    run: str = _run()
    node_index: int
    attempt: int
    vm: str  # the VM identity, e.g. "train-a1-n0"; clouds see it as the label gpuprov-<vm>
    provider: str
    region: str
    zone: str | None = None
    instance_ids: list[str] = _json()
    status: str  # VM_STATUSES
    created_at: datetime = _time()  # recorded, just before the create call
    terminated_at: datetime | None = _time(nullable=True)
    # The offer it was created from: what an actual cost is computed from when it is gone.
    instance_type: str | None = None
    price_amount: float | None = None  # the offer's quote, per instance; None: no quote
    price_currency: str | None = None
    price_unit: str | None = None  # "hour": the amount is per instance-hour
    price_source: str | None = _text(nullable=True)
    billing_granularity_seconds: float | None = None  # the cloud's documented terms, if any
    billing_minimum_seconds: float | None = None
    # When the cloud accepted the create (its answer, or the observe that adopted what it made).
    launched_at: datetime | None = _time(nullable=True)


class VmFence(Table, table=True):
    """What may still act on a VM identity in the cloud, and whether its teardown has begun.

    A row per VM identity, written by the first prepare, create or teardown that names it (a
    prepare runs before the VM row exists). `call_until`: a prepare or create call may still
    land until then (its owner, one activity attempt, clears it when the call returns); a
    teardown waits for that moment before it looks for what to delete. `fenced_at`: teardown
    has begun, and no prepare or create for this identity calls the cloud again.
    """

    __tablename__ = "vm_fences"

    vm: str = Field(primary_key=True)
    fenced_at: datetime | None = _time(nullable=True)
    call_owner: str | None = None  # "<workflow run>/<activity id>/<attempt>"
    call_until: datetime | None = _time(nullable=True)
    updated_at: datetime = _time()


class JoinToken(Table, table=True):
    """A single-use join token: only its SHA-256 is stored, bound to one VM or one label."""

    __tablename__ = "join_tokens"
    __table_args__ = (
        sa.UniqueConstraint("token_sha256", name="uq_join_tokens_token_sha256"),
        sa.ForeignKeyConstraint(["vm"], ["vms.vm"], name="fk_join_tokens_vm_vms"),
        sa.CheckConstraint("(vm IS NULL) <> (label IS NULL)", name="ck_join_tokens_one_binding"),
        sa.Index("ix_join_tokens_vm", "vm"),
        sa.Index("ix_join_tokens_label", "label"),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    token_sha256: str
    vm: str | None = None  # a managed node's VM row (vms.vm)
    label: str | None = None  # an existing worker's reservation label
    expires_at: datetime = _time()
    used_at: datetime | None = _time(nullable=True)
    created_at: datetime = _time()


class CostRecord(Table, table=True):
    """An `estimate` (a job's hourly rate on an offer) or an `actual` (what one machine cost
    from launch to gone); gpuprov/store/costs.py computes and reads them."""

    __tablename__ = "cost_records"
    __table_args__ = (
        sa.Index("ix_cost_records_job", "job"),
        # One actual per machine, however often its termination is confirmed.
        sa.Index(
            "uq_cost_records_actual_vm",
            "vm",
            unique=True,
            sqlite_where=sa.text("kind = 'actual'"),
            postgresql_where=sa.text("kind = 'actual'"),
        ),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    job: str
    run: str = _run()
    kind: str  # COST_KINDS
    amount: float
    currency: str
    unit: str  # "hour" for an estimate; "total" for an actual
    source: str
    recorded_at: datetime = _time()
    provider: str | None = None  # the offer's provider, where the writer knew it
    vm: str | None = None  # an actual's machine
    billed_seconds: float | None = None  # an actual's running time as billed


class BlockRecord(Table, table=True):
    """An offer, region or provider skipped by every job's plan until `expires_at`."""

    __tablename__ = "blocks"
    __table_args__ = (
        sa.UniqueConstraint("scope", "key", name="uq_blocks_scope_key"),
        sa.Index("ix_blocks_expires_at", "expires_at"),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    scope: str  # BLOCK_SCOPES
    key: str
    kind: str  # the ErrorKind value that caused it
    message: str = _text()
    job: str
    created_at: datetime = _time()
    expires_at: datetime = _time()
    # Capacity failures in a row (the backoff) and the launch budget once the block lapsed
    # (gpuprov/store/capacity.py).
    strikes: int = _with_default(sa.Integer(), 0, "0")
    probes: int = _with_default(sa.Integer(), 0, "0")
    probe_window_start: datetime | None = _time(nullable=True)


class WorkerRecord(Table, table=True):
    __tablename__ = "workers"
    __table_args__ = (
        sa.Index("ix_workers_job", "job"),
        sa.Index("ix_workers_state", "state"),
        sa.Index("ix_workers_vm", "vm"),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    origin: str  # WORKER_ORIGINS
    provider: str | None = None
    region: str | None = None
    label: str | None = None  # reservation label
    vm: str | None = None
    capabilities: dict[str, Any] = _json()
    state: str  # WORKER_STATES
    job: str | None = None
    run: str = _run()  # the run of `job` that reserved it, or that its machine was made for
    registered_at: datetime = _time()
    updated_at: datetime = _time()
    # Liveness (gpuprov/store/liveness.py): the registration is the first sign of life, then each
    # heartbeat. `changed_at` moves when liveness or health changes (or an operator removes the
    # worker); `notified_at` is the `changed_at` its job was last told about.
    last_seen_at: datetime | None = _time(nullable=True)
    heartbeats: int = _with_default(sa.Integer(), 0, "0")
    liveness: str = _with_default(sa.String(), "alive", "alive")  # WORKER_LIVENESS
    health: str = _with_default(sa.String(), "healthy", "healthy")  # WORKER_HEALTH
    health_detail: str | None = _text(nullable=True)
    draining: bool = _with_default(sa.Boolean(), False, sa.false())
    changed_at: datetime | None = _time(nullable=True)
    notified_at: datetime | None = _time(nullable=True)
    # The lease (migration 0011): past `work_ends_by` a node that heard nothing more from the
    # API has stopped its work; `notice` is the cloud's reclaim or maintenance notice it saw.
    work_ends_by: datetime | None = _time(nullable=True)
    notice: str | None = _text(nullable=True)  # its JSON, keys sorted: a repeat compares equal


class WorkerCredential(Table, table=True):
    """A registered worker's credential (gpuprov/store/credentials.py): only the SHA-256 of the
    secret is stored, bound to one worker; revoked with the worker or its machine."""

    __tablename__ = "worker_credentials"
    __table_args__ = (
        sa.ForeignKeyConstraint(
            ["worker_id"], ["workers.id"], name="fk_worker_credentials_worker_id_workers"
        ),
        sa.Index("ix_worker_credentials_worker_id", "worker_id"),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    worker_id: str
    secret_sha256: str
    created_at: datetime = _time()
    revoked_at: datetime | None = _time(nullable=True)


class OperatorKey(Table, table=True):
    """An operator API key (`gpuprov apikey create`): only the SHA-256 of the secret is stored.
    Its role (ROLES) says what it may do, its team where (None: an admin over every team)."""

    __tablename__ = "operator_keys"

    id: str = Field(default_factory=new_id, primary_key=True)
    name: str
    secret_sha256: str
    created_at: datetime = _time()
    revoked_at: datetime | None = _time(nullable=True)
    team: str | None = None
    role: str = _with_default(sa.String(), "admin", "admin")


class TeamRecord(Table, table=True):
    """A team: who jobs and keys belong to, and its budget (gpuprov/store/teams.py)."""

    __tablename__ = "teams"

    name: str = Field(primary_key=True)
    monthly_budget_usd: float | None = None  # USD per calendar month (UTC); None: no limit
    max_gpus: int | None = None  # GPUs its jobs may hold at once; None: no limit
    on_exceed: str = _with_default(sa.String(), "release", "release")  # ON_EXCEED
    created_at: datetime = _time()


class SecretRecord(Table, table=True):
    """A secret's value, AES-256-GCM encrypted (gpuprov/store/secrets.py); team "" is global."""

    __tablename__ = "secrets"
    __table_args__ = (sa.UniqueConstraint("team", "name", name="uq_secrets_team_name"),)

    id: str = Field(default_factory=new_id, primary_key=True)
    team: str = _with_default(sa.String(), "", "")
    name: str
    key_id: str
    nonce: bytes = Field(sa_column=sa.Column(sa.LargeBinary(), nullable=False))
    ciphertext: bytes = Field(sa_column=sa.Column(sa.LargeBinary(), nullable=False))
    created_at: datetime = _time()
    updated_at: datetime = _time()


class WorkRecord(Table, table=True):
    """One node's part of a job's run: what to execute, and how it went. `run` is the job's
    run (a name submitted again starts a new one, with rows of its own); `epoch` counts the
    run's restarts (0 first); a new epoch's rows are written only after the old attempt's
    workers were revoked, so two epochs never run at once."""

    __tablename__ = "work"
    __table_args__ = (
        sa.UniqueConstraint(
            "job", "run", "epoch", "node_rank", name="uq_work_job_run_epoch_node_rank"
        ),
        sa.Index("ix_work_worker_id", "worker_id"),
        sa.Index("ix_work_state_created_at", "state", "created_at"),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    job: str
    run: str = _run()
    epoch: int
    node_rank: int
    worker_id: str
    vm: str | None = None
    command: dict[str, Any] = _json()  # {"setup": str | None, "run": str, "env": {...}}
    state: str  # WORK_STATES
    exit_code: int | None = None
    tail: str | None = _text(nullable=True)  # the last lines of output, for a failure message
    created_at: datetime = _time()
    started_at: datetime | None = _time(nullable=True)
    ended_at: datetime | None = _time(nullable=True)
    updated_at: datetime = _time()
    lease_lapsed: bool = _with_default(sa.Boolean(), False, sa.false())  # stopped by the node


class LogChunk(Table, table=True):
    """A piece of a node's output, in order per (job, run, epoch, node_rank) by `seq`; a run's
    chunks are capped in bytes (oldest dropped, with a `gpuprov` note saying so)."""

    __tablename__ = "log_chunks"
    __table_args__ = (
        sa.UniqueConstraint("work_id", "seq", name="uq_log_chunks_work_id_seq"),
        sa.Index("ix_log_chunks_job_run", "job", "run", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job: str
    run: str = _run()
    work_id: str
    epoch: int
    node_rank: int
    seq: int
    stream: str  # LOG_STREAMS
    data: str = _text()
    size: int  # bytes of data (UTF-8)
    created_at: datetime = _time()


class LogUsage(Table, table=True):
    """A job run's log bytes: kept in log_chunks, and dropped by the cap (oldest first)."""

    __tablename__ = "log_usage"

    job: str = Field(primary_key=True)
    run: str = Field(
        default=NO_RUN, sa_column=sa.Column(sa.String(), primary_key=True, server_default=NO_RUN)
    )
    kept_bytes: int = Field(sa_column=sa.Column(sa.BigInteger(), nullable=False))
    dropped_bytes: int = Field(sa_column=sa.Column(sa.BigInteger(), nullable=False))
    updated_at: datetime = _time()


class JobRun(Table, table=True):
    """A run of a job: recorded by its first write, so the newest is the name's latest run
    (one run of a name is open at a time: Temporal refuses a second workflow `job-<name>`)."""

    __tablename__ = "job_runs"

    job: str = Field(primary_key=True)
    run: str = Field(primary_key=True)
    created_at: datetime = _time()
    team: str | None = None  # None: a run from before teams, read as models.DEFAULT_TEAM
    gpus_per_node: int | None = None  # what each of its machines holds (its team's GPU limit)


class OfferAttempt(Table, table=True):
    """One attempt's outcome on an offering (gpuprov/store/offer_stats.py): what ranks offers by
    time to ready and tells a sold-out region from a slow one. Written once per attempt."""

    __tablename__ = "offer_attempts"
    __table_args__ = (
        sa.UniqueConstraint("job", "run", "attempt", name="uq_offer_attempts_job_run_attempt"),
        sa.Index("ix_offer_attempts_offering_ended_at", "offering", "ended_at"),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    offering: str
    provider: str
    region: str
    instance_type: str
    spot: bool = False
    job: str
    run: str = _run()
    attempt: int
    nodes: int = 1
    outcome: str  # AttemptRecord.outcome
    kind: str | None = None  # the ErrorKind value of a failed attempt
    step: str | None = None
    started_at: datetime = _time()
    ended_at: datetime = _time()
    seconds_to_ready: float | None = None


class OrphanRecord(Table, table=True):
    """A machine whose termination failed; the reconciler keeps trying until it is resolved."""

    __tablename__ = "orphans"
    __table_args__ = (
        sa.Index("ix_orphans_vm", "vm"),
        # At most one unresolved row per VM, even when two processes record it at once.
        sa.Index(
            "uq_orphans_open_vm",
            "vm",
            unique=True,
            sqlite_where=sa.text("resolved_at IS NULL"),
            postgresql_where=sa.text("resolved_at IS NULL"),
        ),
    )

    id: str = Field(default_factory=new_id, primary_key=True)
    provider: str
    region: str
    zone: str | None = None
    vm: str
    instance_ids: list[str] = _json()
    first_seen: datetime = _time()
    last_seen: datetime = _time()
    last_error: str = _text()
    attempts: int
    resolved_at: datetime | None = _time(nullable=True)


class HostKeyPin(Table, table=True):
    """The SSH host key a VM must present: public data, one per VM, never replaced (the first
    worker to record it wins; every other worker verifies the VM against it)."""

    __tablename__ = "ssh_host_keys"
    __table_args__ = (sa.UniqueConstraint("vm", name="uq_ssh_host_keys_vm"),)

    id: str = Field(default_factory=new_id, primary_key=True)
    vm: str  # the VM identity (vms.vm for managed nodes)
    public_key: str = _text()  # one OpenSSH public key line
    created_at: datetime = _time()


class SshClientKey(Table, table=True):
    """A public SSH client key this deployment's workers log in to nodes with (the private half
    is configuration, never stored): how a worker that generated its own key learns that the
    deployment already uses another."""

    __tablename__ = "ssh_client_keys"
    __table_args__ = (sa.UniqueConstraint("fingerprint", name="uq_ssh_client_keys_fingerprint"),)

    id: str = Field(default_factory=new_id, primary_key=True)
    fingerprint: str  # SHA256:... of the key
    public_key: str = _text()
    source: str  # SSH_CLIENT_KEY_SOURCES
    host: str  # the host name of the worker that recorded it first
    registered_at: datetime = _time()


TABLES = tuple(metadata.sorted_tables)

# Alembic keeps the running migration in module globals (`alembic.context`, `alembic.op`), so
# two threads of one process must not migrate at once; processes are kept apart by env.py's lock.
_ALEMBIC_LOCK = threading.Lock()


class DatabaseUnavailable(Exception):
    """The database cannot be opened, reached or migrated now; the message names it (never its
    password) and the database's own words."""


def unavailable(url: str | URL, error: BaseException) -> DatabaseUnavailable:
    """A one-line DatabaseUnavailable for `error` (a DBAPIError, an OSError, ...)."""
    shown = make_url(url).render_as_string(hide_password=True)
    cause = error.orig if isinstance(error, sa.exc.DBAPIError) else error
    if isinstance(cause, OSError) and cause.strerror:
        reason = cause.strerror
    else:
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return DatabaseUnavailable(f"cannot open the database {shown}: {reason}")


# How long opening a PostgreSQL connection may take: psycopg waits forever by default, and a
# request (or a worker's start) would hang with it on a host that drops packets.
POSTGRES_CONNECT_TIMEOUT_SECONDS = 10


def _normalize_url(url: str) -> URL:
    parsed = make_url(url)
    # Only psycopg 3 is installed: plain postgresql:// would ask SQLAlchemy for psycopg2.
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _sqlite_engine(url: URL) -> Engine:
    options: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
    file: Path | None = None
    if not url.database or url.database == ":memory:":
        # One in-memory database only exists per connection: share that one connection.
        options["poolclass"] = sa.StaticPool
    elif not url.database.startswith("file:"):
        file = Path(url.database).expanduser()
        file.parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, **options)
    if file is not None:
        _follow_the_file(engine, file)

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # busy_timeout first: switching to WAL needs a lock too, and without the timeout a
        # process starting beside another failed at once with "database is locked" (seen in
        # CI). WAL lets readers run beside the one writer; a second writer waits its turn.
        cursor.execute("PRAGMA busy_timeout=30000")
        _switch_to_wal(cursor)
        # In WAL mode NORMAL is still crash-safe for the application (a killed worker loses
        # nothing committed); only a power cut may lose the last commits. It skips an fsync
        # per commit, which held SQLite's single write lock for every other writer.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def dialect_insert(dialect: str) -> Callable[..., Any]:
    """The INSERT of `dialect` ("postgresql" or "sqlite"): the one with ON CONFLICT."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def insert_row(session: Session, row: SQLModel) -> None:
    """`row` written by one Core INSERT in the session's transaction: what `session.add` and its
    flush write for a new row, without the unit of work's bookkeeping, which costs several
    times the statement on the paths every job takes. The row stays a plain detached value; a
    duplicate key raises IntegrityError at once."""
    table = type(row).__table__  # type: ignore[attr-defined]
    session.execute(sa.insert(table).values({column.name: getattr(row, column.name)
                                             for column in table.columns}))  # fmt: skip


def _file_identity(file: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(file)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def _follow_the_file(engine: Engine, file: Path) -> None:
    """Never write into a SQLite file that is no longer at its path.

    A connection keeps the file it opened even after that file is deleted or moved: its writes
    would land in a file nobody reads, and a new connection would create an empty database in its
    place. So the file is created once, here; a later connection opens it only while it exists,
    and a pooled connection is dropped when the path no longer holds the file it opened. While the
    file is missing every query raises OperationalError (the API answers 503, activities retry);
    once it is back, the next query opens it again.
    """
    file.touch(exist_ok=True)  # an empty file is an empty SQLite database

    @sa.event.listens_for(engine, "do_connect")
    def _only_if_present(_dialect: Any, _record: Any, _cargs: Any, _cparams: Any) -> None:
        if _file_identity(file) is None:
            raise sqlite3.OperationalError(f"database file {file} is missing")

    @sa.event.listens_for(engine, "connect")
    def _remember(_dbapi_connection: Any, record: Any) -> None:
        record.info["file"] = _file_identity(file)

    @sa.event.listens_for(engine, "checkout")
    def _still_there(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.get("file") != _file_identity(file):
            # Drops every pooled connection; the pool then opens a fresh one (or fails).
            raise sa.exc.InvalidatePoolError(f"database file {file} was moved or replaced")


def _switch_to_wal(cursor: Any, patience: float = 30.0) -> None:
    """WAL is a property of the database file: once one process switched, the others only read
    it. The switch itself needs the file's exclusive lock, and SQLite can answer "database is
    locked" at once, without waiting out busy_timeout, while another process holds a write lock
    (seen with four processes starting together): so wait and try again, within `patience`."""
    deadline = time.monotonic() + patience
    while True:
        if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


class Database:
    """One engine per process; `upgrade()` once at start-up, then `session()` per unit of work."""

    def __init__(self, url: str) -> None:
        self.url = _normalize_url(url)
        if self.url.get_backend_name() == "sqlite":
            self.engine = _sqlite_engine(self.url)
        else:
            timeout = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_SECONDS}
            if "connect_timeout" in self.url.query:  # the URL's own choice wins
                timeout = {}
            self.engine = sa.create_engine(self.url, pool_pre_ping=True, connect_args=timeout)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def session(self) -> Session:
        """A new session; objects stay readable after commit and after the session closes."""
        return Session(self.engine, expire_on_commit=False)

    def upgrade(self, revision: str = "head") -> None:
        """Run the Alembic migrations up to `revision`; a no-op when already there.

        Safe to call from several processes at once: the migration takes a database-wide lock
        first (an advisory lock on PostgreSQL, BEGIN IMMEDIATE on SQLite).
        """
        with _ALEMBIC_LOCK, self.engine.connect() as connection:
            command.upgrade(alembic_config(connection), revision)
            connection.commit()

    def downgrade(self, revision: str) -> None:
        with _ALEMBIC_LOCK, self.engine.connect() as connection:
            command.downgrade(alembic_config(connection), revision)
            connection.commit()

    def current_revision(self) -> str | None:
        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def dispose(self) -> None:
        self.engine.dispose()


def open_database(url: str) -> Database:
    """The database at `url`, its schema brought to the latest migration.

    DatabaseUnavailable, one line without the password, when it cannot be opened or migrated."""
    database: Database | None = None
    try:
        database = Database(url)
        database.upgrade()
    except (sa.exc.DBAPIError, OSError) as error:
        if database is not None:
            database.dispose()
        raise unavailable(url, error) from None
    return database


def alembic_config(connection: sa.Connection | None = None) -> Config:
    """Alembic's configuration, built in code: no alembic.ini needed at the repository root."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config
