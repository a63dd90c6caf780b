"""The fake cloud's ledger: instances, side resources, fault counters and call counts, and what
the simulated agents keep on their machines' disks (their credential, and the lease of an agent
that is to be cut off from the API).

Kept in SQLite so it can live in a file that survives a worker restart and that a test (or the
chaos harness) in another process can read: every instance ever created stays as a row, so
"creates per VM identity" is a count, not a guess. In-memory (`:memory:`) by default.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    vm TEXT NOT NULL,
    region TEXT NOT NULL,
    zone TEXT,
    offer_id TEXT NOT NULL,
    instance_type TEXT NOT NULL,
    boot_mode TEXT NOT NULL,
    created_at REAL NOT NULL,
    deleted_at REAL,
    api_url TEXT,
    join_token TEXT,
    agent_state TEXT NOT NULL DEFAULT 'pending',
    agent_pid INTEGER,
    user_data TEXT,
    fault_after REAL NOT NULL DEFAULT 0,
    image TEXT,
    ports TEXT NOT NULL DEFAULT '[]',
    credential TEXT,
    cut_at REAL
);
CREATE INDEX IF NOT EXISTS instances_vm ON instances (vm, region);
CREATE TABLE IF NOT EXISTS side_resources (
    vm TEXT NOT NULL,
    region TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at REAL NOT NULL,
    deleted_at REAL,
    PRIMARY KEY (vm, region, kind)
);
CREATE TABLE IF NOT EXISTS fault_hits (
    rule INTEGER PRIMARY KEY,
    matched INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_fires (
    rule INTEGER PRIMARY KEY,
    fired INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS agent_leases (
    id TEXT PRIMARY KEY,
    sent_at REAL,
    lease_seconds REAL,
    work_id TEXT,
    stop_grace REAL,
    work_stops_at REAL
);
CREATE TABLE IF NOT EXISTS calls (
    primitive TEXT NOT NULL,
    region TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (primitive, region)
);
"""


NEWER_COLUMNS = {
    "agent_pid": "INTEGER",
    "user_data": "TEXT",
    "fault_after": "REAL NOT NULL DEFAULT 0",
    "image": "TEXT",
    "ports": "TEXT NOT NULL DEFAULT '[]'",
    "credential": "TEXT",
    "cut_at": "REAL",
}
INSTANCE_COLUMNS = (
    "id, vm, region, zone, offer_id, instance_type, boot_mode, created_at, deleted_at, api_url, "
    "join_token, agent_state, user_data, fault_after, image, ports, credential, cut_at"
)


@dataclass(frozen=True)
class InstanceRow:
    id: str
    vm: str
    region: str
    zone: str | None
    offer_id: str
    instance_type: str
    # normal / failed / hang / bad_runtime / no_agent / preempted / gpu_lost / ecc_error /
    # gpu_missing / partitioned
    boot_mode: str
    created_at: float
    deleted_at: float | None
    api_url: str | None = None  # the node's bootstrap (the cloud's "user data")
    join_token: str | None = None
    # pending / running (a worker process runs its simulated agent) / registered / rejected /
    # ended (its credential was refused) / started (the real agent)
    agent_state: str = "pending"
    user_data: str | None = None  # what cloud-init would get (the real-agent mode)
    # A GPU fault (gpu_lost, ...) shows this long after boot; a partition this long after the
    # agent registered.
    fault_after: float = 0.0
    image: str | None = None  # what create was asked to boot (the spec's image)
    ports: tuple[int, ...] = ()  # what create was asked to open (the spec's ports)
    credential: str | None = None  # the simulated agent's, once registered (kept on its disk)
    cut_at: float | None = None  # a partitioned agent: cut off from the API from then on


@dataclass(frozen=True)
class AgentLease:
    """What a simulated agent that is to be cut off from the API last heard (the lease rule of
    gpuprov/node/lease.py, in wall-clock time): the last answered heartbeat's send time and the
    lease it granted, the work it holds and the stop grace its assignment gives, and so when
    that work has stopped if nothing more is answered (`work_stops_at`: the lease's end plus the
    grace; None while it holds no work or was granted no lease)."""

    id: str
    vm: str
    cut_at: float | None
    deleted_at: float | None
    sent_at: float | None
    lease_seconds: float | None
    work_id: str | None
    stop_grace: float | None
    work_stops_at: float | None


class FakeCloudState:
    """Thread-safe enough for one event loop per process; SQLite locking handles processes."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or ":memory:"
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self._db.execute("PRAGMA busy_timeout = 30000")
        self._db.executescript(SCHEMA)
        self._add_columns()

    def close(self) -> None:
        self._db.close()

    def _add_columns(self) -> None:
        """A ledger file written before the real-agent mode lacks its two columns."""
        have = {row[1] for row in self._db.execute("PRAGMA table_info(instances)").fetchall()}
        for column, declaration in NEWER_COLUMNS.items():
            if column not in have:
                self._db.execute(f"ALTER TABLE instances ADD COLUMN {column} {declaration}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # ------------------------------------------------------------------ faults and calls

    def count_call(self, primitive: str, region: str) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO calls VALUES (?, ?, 1) "
                "ON CONFLICT (primitive, region) DO UPDATE SET n = n + 1",
                (primitive, region),
            )

    def call_counts(self) -> dict[tuple[str, str], int]:
        rows = self._db.execute("SELECT primitive, region, n FROM calls").fetchall()
        return {(primitive, region): n for primitive, region, n in rows}

    def hit_fault(self, rule: int, after: int, times: int | None) -> bool:
        """Count one matching call for `rule`; True if this call is one the rule fires on
        (and then the firing is counted too)."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO fault_hits VALUES (?, 1) "
                "ON CONFLICT (rule) DO UPDATE SET matched = matched + 1",
                (rule,),
            )
            (matched,) = db.execute(
                "SELECT matched FROM fault_hits WHERE rule = ?", (rule,)
            ).fetchone()
            fires = matched > after and (times is None or matched <= after + times)
            if fires:
                db.execute(
                    "INSERT INTO fault_fires VALUES (?, 1) "
                    "ON CONFLICT (rule) DO UPDATE SET fired = fired + 1",
                    (rule,),
                )
        return fires

    def fault_fires(self) -> dict[int, int]:
        """Times each rule fired, by its index in the configured list (rules that never fired
        are absent)."""
        return dict(self._db.execute("SELECT rule, fired FROM fault_fires").fetchall())

    # ------------------------------------------------------------------ instances

    def add_instance(
        self,
        *,
        vm: str,
        region: str,
        zone: str | None,
        offer_id: str,
        instance_type: str,
        boot_mode: str,
        api_url: str | None = None,
        join_token: str | None = None,
        user_data: str | None = None,
        fault_after: float = 0.0,
        image: str | None = None,
        ports: list[int] | None = None,
    ) -> str:
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO instances (id, vm, region, zone, offer_id, instance_type, "
                "boot_mode, created_at, api_url, join_token, user_data, fault_after, image, "
                "ports) "
                "VALUES ('', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    vm,
                    region,
                    zone,
                    offer_id,
                    instance_type,
                    boot_mode,
                    time.time(),
                    api_url,
                    join_token,
                    user_data,
                    fault_after,
                    image,
                    json.dumps(ports or []),
                ),
            )
            instance_id = f"fake-i-{cursor.lastrowid:06d}"
            db.execute("UPDATE instances SET id = ? WHERE seq = ?", (instance_id, cursor.lastrowid))
        return instance_id

    def instances(
        self, vm: str | None = None, region: str | None = None, gone_by: float | None = None
    ) -> list[InstanceRow]:
        """Every instance ever created (the ledger), or, with `gone_by`, only those not deleted
        at or before that time: a region's list builds and judges its live instances only (the
        scan of the table stays in SQLite, which uses no index with these optional filters)."""
        query = (
            f"SELECT {INSTANCE_COLUMNS} FROM instances "
            "WHERE (? IS NULL OR vm = ?) AND (? IS NULL OR region = ?) "
            "AND (? IS NULL OR deleted_at IS NULL OR deleted_at > ?) "
            "ORDER BY seq"
        )
        args = (vm, vm, region, region, gone_by, gone_by)
        return [_instance_row(row) for row in self._db.execute(query, args).fetchall()]

    def claim_agent(self, instance_id: str, pid: int | None = None) -> bool:
        """Whether process `pid` (this one by default) is to run the instance's agent: a node
        runs one agent, however many workers observe it booting. Yes while the agent is
        pending, or was being run by a process that has died (a killed worker); no while
        another live process runs it or it has finished."""
        pid = os.getpid() if pid is None else pid
        with self._transaction() as db:
            row = db.execute(
                "SELECT agent_state, agent_pid FROM instances WHERE id = ?", (instance_id,)
            ).fetchone()
            if row is None or row[0] not in ("pending", "running"):
                return False
            state, runner = row
            if state == "running" and runner != pid and _alive(runner):
                return False
            db.execute(
                "UPDATE instances SET agent_state = 'running', agent_pid = ? WHERE id = ?",
                (pid, instance_id),
            )
        return True

    def resume_agent(self, instance_id: str, pid: int | None = None) -> bool:
        """Whether process `pid` (this one by default) is to run the heartbeats of an agent that
        registered already: its machine runs on when the worker process that ran it dies, so
        another one takes it over, with the credential kept on the machine. No while a live
        process (another, or this one) runs it, or once its credential was refused."""
        pid = os.getpid() if pid is None else pid
        with self._transaction() as db:
            row = db.execute(
                "SELECT agent_state, agent_pid, credential FROM instances WHERE id = ?",
                (instance_id,),
            ).fetchone()
            if row is None or row[0] != "registered" or row[2] is None:
                return False
            if row[1] != pid and _alive(row[1]):
                return False
            db.execute("UPDATE instances SET agent_pid = ? WHERE id = ?", (pid, instance_id))
        return True

    def registered_agents(self) -> list[InstanceRow]:
        """Instances not deleted whose simulated agent registered and kept its credential."""
        query = (
            f"SELECT {INSTANCE_COLUMNS} FROM instances WHERE agent_state = 'registered' "
            "AND credential IS NOT NULL AND deleted_at IS NULL ORDER BY seq"
        )
        return [_instance_row(row) for row in self._db.execute(query).fetchall()]

    def registered(self, instance_id: str, credential: str, cut_at: float | None) -> None:
        """The simulated agent registered: its credential (and, partitioned, when it is cut off
        from the API at the latest) are kept for whichever worker process runs it next."""
        with self._transaction() as db:
            db.execute(
                "UPDATE instances SET agent_state = 'registered', credential = ?, "
                "cut_at = CASE WHEN cut_at IS NULL OR cut_at > ? THEN ? ELSE cut_at END "
                "WHERE id = ?",
                (credential, cut_at, cut_at, instance_id),
            )

    def cut_off(self, instance_id: str, at: float | None = None) -> None:
        """A partitioned agent is cut off from the API from `at` (now by default), or from when
        it was to be already if that is sooner."""
        at = time.time() if at is None else at
        with self._transaction() as db:
            db.execute(
                "UPDATE instances SET cut_at = ? WHERE id = ? AND (cut_at IS NULL OR cut_at > ?)",
                (at, instance_id, at),
            )

    def is_cut_off(self, instance_id: str) -> bool:
        row = self._db.execute("SELECT cut_at FROM instances WHERE id = ?", (instance_id,))
        found = row.fetchone()
        return found is not None and found[0] is not None and time.time() >= found[0]

    def renew_lease(self, instance_id: str, sent_at: float, seconds: float | None) -> None:
        """A heartbeat the agent sent at `sent_at` was answered, granting `seconds`."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO agent_leases (id, sent_at, lease_seconds) VALUES (?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET sent_at = excluded.sent_at, "
                "lease_seconds = excluded.lease_seconds",
                (instance_id, sent_at, seconds),
            )
            self._stops_at(db, instance_id)

    def hold_work(self, instance_id: str, work_id: str, stop_grace: float) -> None:
        """The agent holds the work `work_id` (read from its assignment, with its grace)."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO agent_leases (id, work_id, stop_grace) VALUES (?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET work_id = excluded.work_id, "
                "stop_grace = excluded.stop_grace",
                (instance_id, work_id, stop_grace),
            )
            self._stops_at(db, instance_id)

    @staticmethod
    def _stops_at(db: sqlite3.Connection, instance_id: str) -> None:
        db.execute(
            "UPDATE agent_leases SET work_stops_at = CASE WHEN work_id IS NOT NULL "
            "AND sent_at IS NOT NULL AND lease_seconds IS NOT NULL "
            "THEN sent_at + lease_seconds + COALESCE(stop_grace, 0) END WHERE id = ?",
            (instance_id,),
        )

    def agent_lease(self, instance_id: str) -> AgentLease | None:
        return next((lease for lease in self.agent_leases() if lease.id == instance_id), None)

    def agent_leases(self) -> list[AgentLease]:
        """The lease of every partitioned instance's agent (the only ones kept), with the
        instance's VM, cut-off time and deletion; its fields None until its agent heard them."""
        rows = self._db.execute(
            "SELECT i.id, i.vm, i.cut_at, i.deleted_at, l.sent_at, l.lease_seconds, l.work_id, "
            "l.stop_grace, l.work_stops_at FROM instances i LEFT JOIN agent_leases l "
            "ON l.id = i.id WHERE i.boot_mode = 'partitioned' ORDER BY i.seq"
        ).fetchall()
        return [AgentLease(*row) for row in rows]

    def set_agent_state(self, instance_id: str, agent_state: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE instances SET agent_state = ? WHERE id = ?", (agent_state, instance_id)
            )

    def preempt(self, instance_id: str) -> None:
        """The cloud takes the machine back (a spot interruption): it reports Failed from now."""
        with self._transaction() as db:
            db.execute("UPDATE instances SET boot_mode = 'preempted' WHERE id = ?", (instance_id,))

    def mark_deleted(self, vm: str, region: str, ids: list[str]) -> None:
        with self._transaction() as db:
            for instance_id in ids:
                db.execute(
                    "UPDATE instances SET deleted_at = ? "
                    "WHERE id = ? AND vm = ? AND region = ? AND deleted_at IS NULL",
                    (time.time(), instance_id, vm, region),
                )

    def creates_per_vm(self) -> dict[str, int]:
        rows = self._db.execute("SELECT vm, COUNT(*) FROM instances GROUP BY vm").fetchall()
        return dict(rows)

    def live_instances(self, delete_delay: float) -> list[InstanceRow]:
        """Instances not yet gone: never deleted, or deleted less than `delete_delay` ago."""
        return self.instances(gone_by=time.time() - delete_delay)

    # ------------------------------------------------------------------ side resources

    def add_side_resource(self, vm: str, region: str, kind: str, name: str) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO side_resources VALUES (?, ?, ?, ?, ?, NULL) "
                "ON CONFLICT (vm, region, kind) DO UPDATE SET deleted_at = NULL",
                (vm, region, kind, name, time.time()),
            )

    def delete_side_resources(self, vm: str, region: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE side_resources SET deleted_at = ? "
                "WHERE vm = ? AND region = ? AND deleted_at IS NULL",
                (time.time(), vm, region),
            )

    def region_side_resources(self, region: str) -> list[tuple[str, str, str]]:
        """(vm, kind, name) of every side resource of the region not deleted yet."""
        return self._db.execute(
            "SELECT vm, kind, name FROM side_resources "
            "WHERE region = ? AND deleted_at IS NULL ORDER BY vm, kind",
            (region,),
        ).fetchall()

    def live_side_resources(self) -> list[tuple[str, str, str, str]]:
        return self._db.execute(
            "SELECT vm, region, kind, name FROM side_resources WHERE deleted_at IS NULL"
        ).fetchall()


def _instance_row(row: tuple) -> InstanceRow:  # type: ignore[type-arg]
    """A row of INSTANCE_COLUMNS."""
    return InstanceRow(
        *row[:15], ports=tuple(json.loads(row[15])), credential=row[16], cut_at=row[17]
    )


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
