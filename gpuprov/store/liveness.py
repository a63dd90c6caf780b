"""Reads and writes of the workers' liveness columns: heartbeats, lost workers, drains, removals,
and which jobs must be woken because one of their workers changed.

    heartbeat(worker, healthy, ...)     one heartbeat: one UPDATE ... RETURNING (liveness,
                                        health, lease, the cloud's notice), and for a reserved
                                        or busy worker its current work
    heartbeats([Heartbeat, ...])        the API: a batch of agents' heartbeats, each checked by
                                        its credential, in one transaction (one commit)
    changed(worker)                     the API, when the worker's work moved on (started, ended)
    mark_lost(lost_after)               the sweep: alive workers silent for too long -> lost
    pending(limit) / notified(...)      the sweep: workers whose change their job was not told
    of_job(job, run)                    the job's local activity `job_workers`: the truth
    set_draining / remove               `gpuprov workers drain|undrain|remove` and the API

A worker's `changed_at` moves when its liveness (alive/lost), its health verdict
(healthy/unhealthy) or the cloud's notice about its machine changes, when its work starts or
ends, or when an operator removes it; heartbeats that change nothing only bump `last_seen_at`,
the count and the lease. The sweep tells the
worker's job and records the `changed_at` it told about in `notified_at`, only if no newer
change came in between (the API does the same when it tells the job itself). A change is
pending while the two differ, so the pair needs no agreement between the clocks of API and
worker.

Each method is its own transaction and, like store/records.py, settles races with conditional
UPDATEs in the database. Returned rows are detached.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from gpuprov.models import WorkState
from gpuprov.store.credentials import live_worker_id, revoke_worker_credentials
from gpuprov.store.db import Database, UtcDateTime, WorkerRecord, WorkRecord, utcnow
from gpuprov.store.work import NEWEST_FIRST, current_work

MAX_DETAIL = 500  # characters of a health detail kept


@dataclass(frozen=True)
class Beat:
    """What a heartbeat answers the agent: its worker's state, whether it is draining, and its
    current work (gpuprov/store/work.py) with whether that work is to stop."""

    state: str
    draining: bool
    changed: bool  # this heartbeat changed the worker's liveness, health or notice
    at: datetime | None = None  # when it was recorded (its `changed_at`, if it changed)
    work_id: str | None = None
    stop_requested: bool = False
    worker_id: str | None = None
    job: str | None = None  # the worker's job, if it has one


@dataclass(frozen=True)
class Heartbeat:
    """One agent's heartbeat as it came in: its credential as presented (checked in the batch's
    transaction, never kept) and what it reported."""

    credential: str
    healthy: bool
    detail: str | None = None
    notice: dict[str, Any] | None = None


# Only a reserved or busy worker can have work: an idle one's heartbeat reads no more.
WITH_WORK = ("reserved", "busy")


def _update() -> sa.Update:
    return sa.update(WorkerRecord).execution_options(synchronize_session=False)


def _returning(update: sa.Update) -> sa.Update:
    return update.returning(WorkerRecord).execution_options(
        synchronize_session=False, populate_existing=True
    )


def _heartbeat_statement() -> sa.Update:
    """The one UPDATE a heartbeat is, built once: the API runs it for every heartbeat of every
    node, and building it anew cost more than running it."""
    now = sa.bindparam("now", type_=UtcDateTime())
    health = sa.bindparam("health", type_=sa.String())
    notice = sa.bindparam("notice", type_=sa.Text())
    changes = sa.or_(
        col(WorkerRecord.liveness) != "alive",
        col(WorkerRecord.health) != health,
        col(WorkerRecord.notice).is_distinct_from(notice),
    )
    return (
        sa.update(WorkerRecord)
        .where(
            col(WorkerRecord.id) == sa.bindparam("worker_id", type_=sa.String()),
            col(WorkerRecord.state) != "revoked",
        )
        .values(
            last_seen_at=now,
            heartbeats=WorkerRecord.heartbeats + 1,
            liveness="alive",
            health=health,
            health_detail=sa.bindparam("detail", type_=sa.Text()),
            work_ends_by=sa.bindparam("work_ends_by", type_=UtcDateTime()),
            notice=notice,
            # Every SET expression reads the row as it was before this UPDATE.
            changed_at=sa.case((changes, now), else_=WorkerRecord.changed_at),
        )
        .returning(
            WorkerRecord.state, WorkerRecord.draining, WorkerRecord.changed_at, WorkerRecord.job
        )
    )


def _current_work_statement() -> sa.Select:
    """The worker's newest unfinished work (as WorkRecords.for_worker reads it), built once."""
    worker_id = sa.bindparam("worker_id", type_=sa.String())
    return (
        sa.select(WorkRecord.id, WorkRecord.state)
        .where(*current_work(worker_id))
        .order_by(*NEWEST_FIRST)
        .limit(1)
    )


class Liveness:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._heartbeat = _heartbeat_statement()
        self._current_work = _current_work_statement()

    def heartbeat(
        self,
        worker_id: str,
        *,
        healthy: bool,
        detail: str | None,
        holds_work_for: timedelta | None = None,
        notice: dict[str, Any] | None = None,
        now: datetime | None = None,
    ) -> Beat | None:
        """Record one heartbeat: last seen now, one more beat, alive, the given health, the
        cloud's notice (None: none now), and `work_ends_by` now plus `holds_work_for` (the lease
        it is granted and the stop grace period: None, no lease). None when the worker is
        revoked (or unknown): nothing is written then, so a revoked worker's lease is final."""
        now = now or utcnow()
        with self.db.engine.begin() as connection:  # plain statements: no ORM session needed
            return self._beat(connection, worker_id, healthy, detail, holds_work_for, notice, now)

    def heartbeats(
        self,
        beats: Sequence[Heartbeat],
        *,
        holds_work_for: timedelta | None = None,
        now: datetime | None = None,
    ) -> list[Beat | None]:
        """Record a batch of heartbeats, as `heartbeat` each, in one transaction: one commit
        for the batch, so its cost is shared. Each is first checked by its credential (None for
        a credential that is unknown, revoked, or of a revoked worker: nothing is written for
        it). Nothing is acknowledged before the commit: a batch that fails fails every beat in
        it, and a worker is never taken for alive on a heartbeat that was not recorded."""
        now = now or utcnow()
        answers: list[Beat | None] = [None] * len(beats)
        # rows are locked in credential order, the same in every API process: two batches on
        # one PostgreSQL that share a worker (a heartbeat retried on the other process) wait
        # for each other instead of deadlocking
        order = sorted(range(len(beats)), key=lambda index: beats[index].credential)
        with self.db.engine.begin() as connection:
            for index in order:
                beat = beats[index]
                worker_id = live_worker_id(connection, beat.credential)
                if worker_id is not None:
                    answers[index] = self._beat(
                        connection,
                        worker_id,
                        beat.healthy,
                        beat.detail,
                        holds_work_for,
                        beat.notice,
                        now,
                    )
        return answers

    def _beat(
        self,
        connection: sa.Connection,
        worker_id: str,
        healthy: bool,
        detail: str | None,
        holds_work_for: timedelta | None,
        notice: dict[str, Any] | None,
        now: datetime,
    ) -> Beat | None:
        values = {
            "worker_id": worker_id,
            "now": now,
            "health": "healthy" if healthy else "unhealthy",
            "detail": detail[:MAX_DETAIL] if detail else None,
            "work_ends_by": now + holds_work_for if holds_work_for is not None else None,
            "notice": json.dumps(notice, sort_keys=True) if notice else None,
        }
        row = connection.execute(self._heartbeat, values).first()
        if row is None:
            return None
        state, draining, changed_at, job = row
        work = None
        if state in WITH_WORK:
            work = connection.execute(self._current_work, {"worker_id": worker_id}).first()
        return Beat(
            state=state,
            draining=bool(draining),
            changed=changed_at == now,
            at=now,
            work_id=work[0] if work else None,
            stop_requested=bool(work) and work[1] == WorkState.STOP_REQUESTED.value,
            worker_id=worker_id,
            job=job,
        )

    def changed(self, worker_id: str, now: datetime | None = None) -> tuple[str, datetime] | None:
        """Stamp the worker changed (its work moved on: the sweep will wake its job); its job
        and the stamp, or None for a worker of no job (or no worker)."""
        now = now or utcnow()
        update = (
            _update()
            .where(col(WorkerRecord.id) == worker_id)
            .values(changed_at=now)
            .returning(WorkerRecord.job)
        )
        with self.db.engine.begin() as connection:
            job = connection.execute(update).scalar()
        return (job, now) if job else None

    def mark_lost(self, lost_after: timedelta, now: datetime | None = None) -> list[WorkerRecord]:
        """Every live (not revoked) worker last seen more than `lost_after` ago becomes lost;
        the rows that changed."""
        now = now or utcnow()
        update = _returning(
            _update()
            .where(
                col(WorkerRecord.liveness) == "alive",
                col(WorkerRecord.state) != "revoked",
                col(WorkerRecord.last_seen_at) < now - lost_after,
            )
            .values(liveness="lost", changed_at=now)
        )
        with self.db.session() as session:
            rows = list(session.exec(update).scalars().all())  # type: ignore[call-overload]
            session.commit()
        return sorted(rows, key=lambda row: (row.registered_at, row.id))

    def pending(self, limit: int = 1000) -> list[WorkerRecord]:
        """Workers of a job with a change their job has not been told about, oldest change
        first."""
        query = (
            select(WorkerRecord)
            .where(
                col(WorkerRecord.job).is_not(None),
                col(WorkerRecord.changed_at).is_not(None),
                sa.or_(
                    col(WorkerRecord.notified_at).is_(None),
                    col(WorkerRecord.notified_at) != col(WorkerRecord.changed_at),
                ),
            )
            .order_by(col(WorkerRecord.changed_at), col(WorkerRecord.id))
            .limit(limit)
        )
        with self.db.session() as session:
            return list(session.exec(query).all())

    def notified(self, worker_id: str, changed_at: datetime) -> bool:
        """Record that the worker's job was told of the change made at `changed_at`; False when
        a newer change came in meanwhile (it stays pending for the next sweep)."""
        update = (
            _update()
            .where(col(WorkerRecord.id) == worker_id, col(WorkerRecord.changed_at) == changed_at)
            .values(notified_at=changed_at)
        )
        with self.db.session() as session:
            told = session.exec(update).rowcount == 1  # type: ignore[call-overload]
            session.commit()
        return told

    def of_job(self, job: str, run: str | None = None) -> list[WorkerRecord]:
        """Every worker the database ties to `job` (to its `run`: never an earlier run's),
        revoked ones included, oldest first."""
        query = select(WorkerRecord).where(WorkerRecord.job == job)
        if run is not None:
            query = query.where(WorkerRecord.run == run)
        query = query.order_by(col(WorkerRecord.registered_at), col(WorkerRecord.id))
        with self.db.session() as session:
            return list(session.exec(query).all())

    def set_draining(self, worker_id: str, draining: bool) -> WorkerRecord | None:
        """Drain (no new reservations) or undrain a worker that is not revoked; its row, or
        None when there is no such worker."""
        values: dict[str, Any] = {"draining": draining, "updated_at": utcnow()}
        update = _returning(
            _update()
            .where(col(WorkerRecord.id) == worker_id, col(WorkerRecord.state) != "revoked")
            .values(values)
        )
        with self.db.session() as session:
            row = session.exec(update).scalars().first()  # type: ignore[call-overload]
            session.commit()
        return row

    def remove(self, worker_id: str) -> WorkerRecord | None:
        """Revoke a worker and its credential in one transaction. It keeps its job, and the
        change is pending for that job; None when there is no such worker, or it was revoked
        already."""
        now = utcnow()
        update = _returning(
            _update()
            .where(col(WorkerRecord.id) == worker_id, col(WorkerRecord.state) != "revoked")
            .values(state="revoked", updated_at=now, changed_at=now)
        )
        with self.db.session() as session:
            row = session.exec(update).scalars().first()  # type: ignore[call-overload]
            if row is not None:
                revoke_worker_credentials(session, now, col(WorkerRecord.id) == worker_id)
            session.commit()
        return row
