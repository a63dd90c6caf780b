"""Alembic migrations on an empty database, on SQLite and on PostgreSQL 15 (conftest)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from gpuprov.store.db import Database, WorkerRecord, alembic_config, metadata, utcnow
from gpuprov.store.records import Records

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REPO = Path(__file__).resolve().parents[2]
INITIAL_TABLES = {"vms", "join_tokens", "cost_records", "blocks", "workers", "orphans"}
CREDENTIAL_TABLES = {"worker_credentials", "operator_keys"}
WORK_TABLES = {"work", "log_chunks"}
SSH_TABLES = {"ssh_host_keys", "ssh_client_keys"}
LOG_USAGE_TABLES = {"log_usage"}
FENCE_TABLES = {"vm_fences"}
RUN_TABLES = {"job_runs"}
OFFER_STATS_TABLES = {"offer_attempts"}
TEAM_TABLES = {"teams", "secrets"}
TABLES = (
    INITIAL_TABLES
    | CREDENTIAL_TABLES
    | SSH_TABLES
    | WORK_TABLES
    | LOG_USAGE_TABLES
    | FENCE_TABLES
    | RUN_TABLES
    | OFFER_STATS_TABLES
    | TEAM_TABLES
)


def schema(db: Database) -> dict[str, Any]:
    """Tables, columns, indexes and constraints as the database reports them."""
    inspector = sa.inspect(db.engine)
    described: dict[str, Any] = {}
    for table in sorted(inspector.get_table_names()):
        described[table] = {
            "columns": [
                (column["name"], str(column["type"]), column["nullable"])
                for column in inspector.get_columns(table)
            ],
            "indexes": sorted(
                (index["name"], tuple(index["column_names"]), bool(index["unique"]))
                for index in inspector.get_indexes(table)
            ),
            "unique": sorted(
                (constraint["name"], tuple(constraint["column_names"]))
                for constraint in inspector.get_unique_constraints(table)
            ),
            "foreign_keys": sorted(
                (key["name"], tuple(key["constrained_columns"]), key["referred_table"])
                for key in inspector.get_foreign_keys(table)
            ),
        }
    return described


def head() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


@pytest.fixture
def empty(database_url: str):
    db = Database(database_url)
    yield db
    db.dispose()


def test_upgrade_creates_exactly_the_tables(empty: Database):
    assert sa.inspect(empty.engine).get_table_names() == []

    empty.upgrade()

    assert set(sa.inspect(empty.engine).get_table_names()) == TABLES | {"alembic_version"}
    assert {table.name for table in metadata.sorted_tables} == TABLES
    assert empty.current_revision() == head() == "0015_work_waits"
    described = schema(empty)
    assert ("uq_vms_vm", ("vm",)) in described["vms"]["unique"]
    assert ("uq_blocks_scope_key", ("scope", "key")) in described["blocks"]["unique"]
    assert ("uq_join_tokens_token_sha256", ("token_sha256",)) in described["join_tokens"]["unique"]
    assert ("ix_vms_job", ("job",), False) in described["vms"]["indexes"]
    assert ("ix_workers_vm", ("vm",), False) in described["workers"]["indexes"]
    assert ("uq_orphans_open_vm", ("vm",), True) in described["orphans"]["indexes"]
    assert ("uq_cost_records_actual_vm", ("vm",), True) in described["cost_records"]["indexes"]
    assert described["join_tokens"]["foreign_keys"] == [("fk_join_tokens_vm_vms", ("vm",), "vms")]
    assert described["worker_credentials"]["foreign_keys"] == [
        ("fk_worker_credentials_worker_id_workers", ("worker_id",), "workers")
    ]
    assert ("uq_ssh_host_keys_vm", ("vm",)) in described["ssh_host_keys"]["unique"]
    fingerprint = ("uq_ssh_client_keys_fingerprint", ("fingerprint",))
    assert fingerprint in described["ssh_client_keys"]["unique"]


def test_the_credentials_migration_upgrades_a_database_in_use_and_goes_back(empty: Database):
    """A deployment at 0001 with workers registered: 0002 adds the credential tables and keeps
    every row; going back to 0001 removes exactly those tables."""
    empty.upgrade("0001_initial")
    records = Records(empty)
    token = records.mint_token(label="box-1", ttl=timedelta(hours=1))
    with empty.session() as session:
        records.redeem_token(session, token, utcnow())
        session.commit()
    insert_worker_at_0001(empty, "box-1")
    before = schema(empty)

    empty.upgrade("0002_credentials")

    after = INITIAL_TABLES | CREDENTIAL_TABLES | {"alembic_version"}
    assert set(sa.inspect(empty.engine).get_table_names()) == after
    assert {table: schema(empty)[table] for table in before} == before
    with empty.engine.connect() as connection:
        labels = connection.exec_driver_sql("SELECT label FROM workers").scalars().all()
    assert labels == ["box-1"]

    empty.downgrade("0001_initial")
    assert schema(empty) == before
    assert empty.current_revision() == "0001_initial"


def insert_worker_at_0001(database: Database, label: str) -> None:
    """A worker row as revision 0001's table holds it (today's model has more columns)."""
    now = utcnow()
    row = WorkerRecord(
        origin="existing",
        label=label,
        capabilities={},
        state="idle",
        registered_at=now,
        updated_at=now,
    )
    columns = ("id", "origin", "label", "capabilities", "state", "registered_at", "updated_at")
    values = {name: getattr(row, name) for name in columns}
    with database.engine.begin() as connection:
        workers = sa.Table("workers", sa.MetaData(), autoload_with=connection)
        connection.execute(sa.insert(workers).values(values))


def test_the_liveness_migration_takes_existing_workers_as_seen_at_their_last_update(
    empty: Database,
):
    empty.upgrade("0006_cost")
    insert_worker_at_0001(empty, "box-1")
    before = schema(empty)

    empty.upgrade("0007_liveness")

    with empty.engine.connect() as connection:  # as 0007's schema has it, not today's model
        worker = connection.execute(sa.text("SELECT * FROM workers")).one()
    assert worker.last_seen_at == worker.updated_at
    assert (worker.heartbeats, worker.liveness, worker.health, bool(worker.draining)) == (
        0,
        "alive",
        "healthy",
        False,
    )
    assert worker.changed_at is None and worker.notified_at is None
    empty.downgrade("0006_cost")
    assert schema(empty) == before
    with empty.engine.connect() as connection:
        labels = connection.exec_driver_sql("SELECT label FROM workers").scalars().all()
    assert labels == ["box-1"]


def test_the_workers_vm_index_comes_and_goes_with_its_migration(empty: Database):
    empty.upgrade("0002_credentials")
    indexes = {index["name"] for index in sa.inspect(empty.engine).get_indexes("workers")}
    assert "ix_workers_vm" not in indexes
    empty.upgrade()
    indexes = {index["name"] for index in sa.inspect(empty.engine).get_indexes("workers")}
    assert "ix_workers_vm" in indexes
    empty.downgrade("0002_credentials")
    indexes = {index["name"] for index in sa.inspect(empty.engine).get_indexes("workers")}
    assert "ix_workers_vm" not in indexes


def test_the_ssh_key_tables_come_and_go_with_their_migration(empty: Database):
    """A deployment at 0003 with a VM recorded: 0004 adds the two SSH key tables and keeps every
    row; going back to 0003 removes exactly those tables."""
    empty.upgrade("0003_workers_vm_index")
    with empty.engine.begin() as connection:  # the row as 0003's code wrote it
        connection.execute(
            sa.text(
                "INSERT INTO vms (id, job, node_index, attempt, vm, provider, region, "
                "instance_ids, status, created_at) VALUES "
                "('v1', 'train', 0, 1, 'train-a1-n0', 'fake', 'r', '[]', 'recorded', :now)"
            ),
            {"now": utcnow()},
        )
    before = schema(empty)

    empty.upgrade("0004_host_keys")

    assert set(schema(empty)) == set(before) | SSH_TABLES
    assert {table: schema(empty)[table] for table in before} == before
    with empty.engine.connect() as connection:
        vms = connection.exec_driver_sql("SELECT vm FROM vms").scalars().all()
    assert vms == ["train-a1-n0"]
    empty.downgrade("0003_workers_vm_index")
    assert schema(empty) == before


def test_the_cost_migration_keeps_every_row_and_goes_back(empty: Database):
    """A deployment at 0005 with machines and estimates: 0006 adds nullable columns (old rows
    have no quote and no launch time) and the one-actual-per-machine index; going back to 0005
    gives exactly the schema it had, rows included."""
    empty.upgrade("0005_work")
    now = utcnow()
    with empty.engine.begin() as connection:  # the tables as 0005's code wrote them
        connection.execute(
            sa.text(
                "INSERT INTO vms (id, job, node_index, attempt, vm, provider, region, "
                "instance_ids, status, created_at) VALUES "
                "('v1', 'train', 0, 1, 'train-a1-n0', 'fake', 'r1', '[]', 'created', :now)"
            ),
            {"now": now},
        )
        connection.execute(
            sa.text(
                "INSERT INTO cost_records (id, job, kind, amount, currency, unit, source, "
                "recorded_at) VALUES ('c1', 'train', 'estimate', 20.0, 'USD', 'hour', 't', :now)"
            ),
            {"now": now},
        )
    before = schema(empty)

    empty.upgrade("0006_cost")

    with empty.engine.connect() as connection:
        vm = connection.exec_driver_sql("SELECT vm, price_amount, launched_at FROM vms").all()
        cost = connection.exec_driver_sql("SELECT amount, provider, vm FROM cost_records").all()
    assert [tuple(row) for row in vm] == [("train-a1-n0", None, None)]
    assert [tuple(row) for row in cost] == [(20.0, None, None)]
    empty.upgrade()  # today's Records reads today's schema
    records = Records(empty)
    records.vm_terminated("train-a1-n0")  # no quote on the old row: no actual
    assert [cost.kind for cost in records.costs("train")] == ["estimate"]

    empty.downgrade("0005_work")
    assert schema(empty) == before
    with empty.engine.connect() as connection:
        status = connection.exec_driver_sql("SELECT status FROM vms").scalars().all()
    assert status == ["terminated"]


def test_the_log_usage_migration_counts_the_output_already_kept_and_goes_back(empty: Database):
    """A deployment at 0007 with output kept for two jobs: 0008 counts each job's bytes; going
    back to 0007 gives exactly the schema it had, rows included."""
    empty.upgrade("0007_liveness")
    with empty.engine.begin() as connection:  # chunks as 0007's code would write them
        for chunk_id, job, size in ((1, "train", 10), (2, "train", 32), (3, "eval", 7)):
            connection.execute(
                sa.text(
                    "INSERT INTO log_chunks (id, job, work_id, epoch, node_rank, seq, stream, "
                    "data, size, created_at) VALUES (:id, :job, 'w', 0, 0, :id, 'stdout', 'x', "
                    ":size, :now)"
                ),
                {"id": chunk_id, "job": job, "size": size, "now": utcnow()},
            )
    before = schema(empty)

    empty.upgrade("0008_log_usage")

    with empty.engine.connect() as connection:
        usage = connection.exec_driver_sql(
            "SELECT job, kept_bytes, dropped_bytes FROM log_usage ORDER BY job"
        ).all()
    assert [tuple(row) for row in usage] == [("eval", 7, 0), ("train", 42, 0)]
    empty.downgrade("0007_liveness")
    assert schema(empty) == before


def test_upgrading_twice_is_a_no_op(empty: Database):
    empty.upgrade()
    Records(empty).record_cost(
        job="train", kind="estimate", amount=1.0, currency="USD", unit="hour", source="test"
    )
    before = schema(empty)

    empty.upgrade()

    assert schema(empty) == before
    assert empty.current_revision() == head()
    assert len(Records(empty).costs("train")) == 1


def test_the_migrations_match_the_models(empty: Database):
    """Autogenerate finds nothing to do: gpuprov.store.db's tables are what the migrations made."""
    empty.upgrade()
    with empty.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_downgrade_to_base_then_upgrade_again(empty: Database):
    empty.upgrade()
    empty.downgrade("base")
    assert set(sa.inspect(empty.engine).get_table_names()) <= {"alembic_version"}
    assert empty.current_revision() is None

    empty.upgrade()
    assert set(sa.inspect(empty.engine).get_table_names()) == TABLES | {"alembic_version"}


UPGRADE_IN_A_PROCESS = textwrap.dedent(
    """
    import sys
    from gpuprov.store.db import Database

    database = Database(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()  # the go signal, sent once every process is ready
    database.upgrade()
    database.dispose()
    """
)


def test_processes_starting_together_migrate_once(database_url: str):
    """A worker and an API (here: four processes) upgrading one empty database at once."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", UPGRADE_IN_A_PROCESS, database_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(4)
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    failures = [
        stderr
        for _, stderr in (process.communicate(timeout=120) for process in processes)
        if stderr.strip()
    ]
    if [process.returncode for process in processes] != [0, 0, 0, 0]:
        pytest.fail("a process failed to migrate:\n" + "\n---\n".join(failures), pytrace=False)

    db = Database(database_url)
    try:
        assert set(sa.inspect(db.engine).get_table_names()) == TABLES | {"alembic_version"}
        with db.engine.connect() as connection:
            versions = connection.exec_driver_sql("SELECT version_num FROM alembic_version")
            assert [row[0] for row in versions] == [head()]
    finally:
        db.dispose()


def test_threads_upgrading_at_once_do_not_trip_over_alembic_globals(database_url: str):
    databases = [Database(database_url) for _ in range(4)]
    barrier = threading.Barrier(len(databases))
    errors: list[BaseException] = []

    def upgrade(db: Database) -> None:
        barrier.wait()
        try:
            db.upgrade()
        except Exception as error:  # asserted on below
            errors.append(error)

    threads = [threading.Thread(target=upgrade, args=(db,)) for db in databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert all(db.current_revision() == head() for db in databases)
    finally:
        for db in databases:
            db.dispose()


def test_sqlite_file_gets_its_directory_wal_and_busy_timeout(tmp_path: Path):
    path = tmp_path / "nested" / "dir" / "gpuprov.db"
    db = Database(f"sqlite:///{path}")
    try:
        db.upgrade()
        assert path.exists() and db.dialect == "sqlite"
        with db.engine.connect() as connection:
            pragma = connection.exec_driver_sql
            assert pragma("PRAGMA journal_mode").scalar() == "wal"
            assert pragma("PRAGMA busy_timeout").scalar() == 30000
            assert pragma("PRAGMA foreign_keys").scalar() == 1
    finally:
        db.dispose()


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg"])
def test_postgres_urls_use_psycopg(scheme: str):
    db = Database(f"{scheme}://user:secret@db.example:5432/gpuprov")
    try:
        assert db.dialect == "postgresql"
        assert db.engine.url.drivername == "postgresql+psycopg"
    finally:
        db.dispose()


def test_in_memory_sqlite_is_one_database_for_every_session():
    db = Database("sqlite://")
    try:
        db.upgrade()
        Records(db).record_cost(
            job="train", kind="estimate", amount=1.0, currency="USD", unit="hour", source="test"
        )
        assert len(Records(db).costs("train")) == 1
    finally:
        db.dispose()


def test_the_runs_migration_tells_each_rows_run_by_its_machine_and_goes_back(empty: Database):
    """A deployment at 0009 with two runs of one name: 0010 gives every row the run its VM
    identity names (work and output through their machine; an estimate names none and keeps
    ""), lists the runs and counts each run's output on its own; going back to 0009 gives
    exactly the schema it had."""
    empty.upgrade("0009_vm_fences")
    now = utcnow()
    statements = [
        "INSERT INTO vms (id, job, node_index, attempt, vm, provider, region, instance_ids, "
        "status, created_at) VALUES ('v1', 'train', 0, 1, 'train-a1-n0-aaaaa1', 'fake', 'r1', "
        "'[]', 'terminated', :now), ('v2', 'train', 0, 1, 'train-a1-n0-bbbbb2', 'fake', 'r1', "
        "'[]', 'running', :now), ('v3', 'old', 0, 1, 'old-a1-n0', 'fake', 'r1', '[]', "
        "'terminated', :now)",
        "INSERT INTO work (id, job, epoch, node_rank, worker_id, vm, command, state, "
        "created_at, updated_at) VALUES ('w1', 'train', 0, 0, 'k1', 'train-a1-n0-aaaaa1', "
        "'{}', 'exited', :now, :now), ('w2', 'train', 1, 0, 'k2', 'train-a1-n0-bbbbb2', '{}', "
        "'started', :now, :now)",
        "INSERT INTO log_chunks (id, job, work_id, epoch, node_rank, seq, stream, data, size, "
        "created_at) VALUES (1, 'train', 'w1', 0, 0, 0, 'stdout', 'x', 10, :now), "
        "(2, 'train', 'w2', 1, 0, 0, 'stdout', 'y', 32, :now), "
        "(3, 'train', 'w2', 1, 0, -1, 'gpuprov', 'dropped', 7, :now)",
        "INSERT INTO log_usage (job, kept_bytes, dropped_bytes, updated_at) VALUES "
        "('train', 49, 100, :now)",
        "INSERT INTO cost_records (id, job, kind, amount, currency, unit, source, recorded_at, "
        "vm) VALUES ('c1', 'train', 'actual', 1.0, 'USD', 'total', 't', :now, "
        "'train-a1-n0-aaaaa1'), ('c2', 'train', 'estimate', 20.0, 'USD', 'hour', 't', :now, "
        "NULL)",
        "INSERT INTO workers (id, origin, vm, capabilities, state, job, registered_at, "
        "updated_at) VALUES ('k2', 'managed', 'train-a1-n0-bbbbb2', '{}', 'busy', 'train', "
        ":now, :now)",
    ]
    with empty.engine.begin() as connection:
        for statement in statements:
            connection.execute(sa.text(statement), {"now": now})
    before = schema(empty)

    empty.upgrade("0010_runs")

    def rows(query: str) -> list[tuple[Any, ...]]:
        with empty.engine.connect() as connection:
            return [tuple(row) for row in connection.exec_driver_sql(query).all()]

    assert rows("SELECT id, run FROM vms ORDER BY id") == [
        ("v1", "aaaaa1"), ("v2", "bbbbb2"), ("v3", "")
    ]  # fmt: skip
    assert rows("SELECT id, run FROM work ORDER BY id") == [("w1", "aaaaa1"), ("w2", "bbbbb2")]
    assert rows("SELECT id, run FROM log_chunks ORDER BY id") == [
        (1, "aaaaa1"), (2, "bbbbb2"), (3, "bbbbb2")
    ]  # fmt: skip
    assert rows("SELECT id, run FROM cost_records ORDER BY id") == [("c1", "aaaaa1"), ("c2", "")]
    assert rows("SELECT id, run FROM workers") == [("k2", "bbbbb2")]
    assert rows("SELECT job, run FROM job_runs ORDER BY run") == [
        ("train", "aaaaa1"), ("train", "bbbbb2")
    ]  # fmt: skip
    assert rows("SELECT run, kept_bytes, dropped_bytes FROM log_usage ORDER BY run") == [
        ("aaaaa1", 10, 0), ("bbbbb2", 39, 100)
    ]  # fmt: skip
    empty.downgrade("0009_vm_fences")
    assert schema(empty) == before
    assert rows("SELECT job, kept_bytes, dropped_bytes FROM log_usage") == [("train", 49, 100)]


def test_0011_gives_workers_a_lease_and_a_notice_and_keeps_their_rows(empty: Database):
    empty.upgrade("0010_runs")
    now = utcnow()
    with empty.engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO workers (id, origin, capabilities, state, registered_at, updated_at) "
                "VALUES ('k1', 'managed', '{}', 'busy', :now, :now)"
            ),
            {"now": now},
        )
        connection.execute(
            sa.text(
                "INSERT INTO work (id, job, epoch, node_rank, worker_id, command, state, "
                "created_at, updated_at) VALUES ('w1', 'train', 0, 0, 'k1', '{}', 'started', "
                ":now, :now)"
            ),
            {"now": now},
        )
    before = schema(empty)

    empty.upgrade("0011_leases")

    with empty.engine.connect() as connection:
        worker = connection.exec_driver_sql("SELECT work_ends_by, notice FROM workers").one()
        work = connection.exec_driver_sql("SELECT lease_lapsed FROM work").one()
    assert tuple(worker) == (None, None)  # no lease heard yet: nothing to wait out
    assert not work[0]
    empty.downgrade("0010_runs")
    assert schema(empty) == before


def test_0012_gives_blocks_strikes_and_a_launch_budget_and_keeps_their_rows(empty: Database):
    empty.upgrade("0011_leases")
    now = utcnow()
    with empty.engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO blocks (id, scope, key, kind, message, job, created_at, expires_at) "
                "VALUES ('b1', 'offer', 'fake/r1/gpu8', 'Capacity', 'sold out', 'train', :now, "
                ":now)"
            ),
            {"now": now},
        )
    before = schema(empty)

    empty.upgrade("0012_capacity_backoff")

    with empty.engine.connect() as connection:
        block = connection.exec_driver_sql(
            "SELECT key, strikes, probes, probe_window_start FROM blocks"
        ).one()
    assert tuple(block) == ("fake/r1/gpu8", 0, 0, None)  # no strikes yet: the old fixed TTL
    empty.downgrade("0011_leases")
    assert schema(empty) == before


def test_0013_adds_the_offer_attempts_and_takes_exactly_them_away(empty: Database):
    empty.upgrade("0012_capacity_backoff")
    before = schema(empty)

    empty.upgrade("0013_offer_stats")

    assert set(schema(empty)) - set(before) == {"offer_attempts"}
    assert ("uq_offer_attempts_job_run_attempt", ("job", "run", "attempt")) in schema(empty)[
        "offer_attempts"
    ]["unique"]
    empty.downgrade("0012_capacity_backoff")
    assert schema(empty) == before
