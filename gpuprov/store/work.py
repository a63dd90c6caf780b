"""The work a job runs on its nodes, in the database: assignments and their states.

The job's workflow writes a run's assignments (one row per node and epoch of the run; a name
submitted again is a new run, whose rows are its own) and asks for stops;
each node's agent reads its assignment and reports through the API (gpuprov/api/work.py). A
row only moves forward: assigned -> started -> exited | stop_requested -> stopped, and any
unfinished row -> abandoned when its epoch is given up. Every write here is idempotent, so a
retried activity or a repeated report changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import Field
from sqlmodel import col, select

from gpuprov.models import NodeWork, WorkState
from gpuprov.store.db import NO_RUN, Database, WorkerRecord, WorkRecord, utcnow
from gpuprov.store.runs import note_run
from providers.base import Model

UNFINISHED = (WorkState.ASSIGNED.value, WorkState.STARTED.value, WorkState.STOP_REQUESTED.value)


class RunCommand(Model):
    """What a node executes: `setup` (if any), then `run`, with `env` added to its environment
    (the job's own variables and the GPUPROV_* ones)."""

    setup: str | None = None
    run: str
    env: dict[str, str] = Field(default_factory=dict)


class Assignment(Model):
    """What one node of an epoch runs, and on which worker."""

    rank: int = Field(ge=0)
    worker_id: str
    vm: str | None = None
    command: RunCommand


class WorkRecords:
    def __init__(self, db: Database) -> None:
        self.db = db

    def assign(
        self, job: str, epoch: int, assignments: Sequence[Assignment], run: str | None = None
    ) -> None:
        """Write the run's rows for the epoch; rows already there (a retry) are left as they
        are. `run` None: a caller from before runs were recorded (its rows belong to no run)."""
        now = utcnow()
        with self.db.session() as session:
            existing = set(
                session.exec(select(WorkRecord.node_rank).where(*_of(job, epoch, run))).all()
            )
            for assignment in assignments:
                if assignment.rank in existing:
                    continue
                session.add(
                    WorkRecord(
                        job=job,
                        run=run or NO_RUN,
                        epoch=epoch,
                        node_rank=assignment.rank,
                        worker_id=assignment.worker_id,
                        vm=assignment.vm,
                        command=assignment.command.model_dump(mode="json"),
                        state=WorkState.ASSIGNED.value,
                        created_at=now,
                        updated_at=now,
                    )
                )
            note_run(session, self.db.dialect, job, run)
            session.commit()

    def request_stop(self, job: str, epoch: int, run: str | None = None) -> int:
        """Ask every unfinished node of the epoch to stop; an assignment nobody started yet is
        stopped at once (its agent will never start it). Returns the rows changed."""
        now = utcnow()
        with self.db.session() as session:
            never_started = session.exec(
                sa.update(WorkRecord)
                .where(*_of(job, epoch, run), col(WorkRecord.state) == WorkState.ASSIGNED.value)
                .values(state=WorkState.STOPPED.value, ended_at=now, updated_at=now)
            ).rowcount
            running = session.exec(
                sa.update(WorkRecord)
                .where(*_of(job, epoch, run), col(WorkRecord.state) == WorkState.STARTED.value)
                .values(state=WorkState.STOP_REQUESTED.value, updated_at=now)
            ).rowcount
            session.commit()
        return never_started + running

    def abandon(self, job: str, epoch: int, run: str | None = None) -> int:
        """Give up the epoch: its unfinished rows are never started, or reported, again."""
        now = utcnow()
        with self.db.session() as session:
            changed = session.exec(
                sa.update(WorkRecord)
                .where(*_of(job, epoch, run), col(WorkRecord.state).in_(UNFINISHED))
                .values(state=WorkState.ABANDONED.value, ended_at=now, updated_at=now)
            ).rowcount
            session.commit()
        return changed

    # ------------------------------------------------------------------ what nodes report

    def for_worker(self, worker_id: str) -> WorkRecord | None:
        """The worker's current work: the newest row that is not over, of the job run the
        worker serves now (None when there is none)."""
        with self.db.session() as session:
            return session.exec(
                select(WorkRecord).where(*current_work(worker_id)).order_by(*NEWEST_FIRST)
            ).first()

    def assigned_since(self, since: datetime) -> list[tuple[str, str]]:
        """(worker id, work id) of every assignment written since `since` and not started
        yet: what a node waiting for its work may be woken for (gpuprov/api/work_waits.py)."""
        with self.db.session() as session:
            rows = session.exec(
                select(WorkRecord.worker_id, WorkRecord.id).where(
                    col(WorkRecord.state) == WorkState.ASSIGNED.value,
                    col(WorkRecord.created_at) > since,
                )
            ).all()
        return [(worker_id, work_id) for worker_id, work_id in rows]

    def of_worker(self, work_id: str, worker_id: str) -> WorkRecord | None:
        """The row, only if it is this worker's (None for another worker's, or none)."""
        with self.db.session() as session:
            row = session.get(WorkRecord, work_id)
        return row if row is not None and row.worker_id == worker_id else None

    def report_started(self, work_id: str, worker_id: str) -> bool:
        """The node started the work. False when that is no longer allowed (stopped before it
        started, abandoned): the node must not start it."""
        now = utcnow()
        with self.db.session() as session:
            changed = session.exec(
                sa.update(WorkRecord)
                .where(
                    *_mine(work_id, worker_id),
                    col(WorkRecord.state) == WorkState.ASSIGNED.value,
                )
                .values(state=WorkState.STARTED.value, started_at=now, updated_at=now)
            ).rowcount
            if not changed:  # a repeat of a report that already counted is fine
                row = session.get(WorkRecord, work_id)
                changed = int(
                    row is not None
                    and row.worker_id == worker_id
                    and row.state in (WorkState.STARTED.value, WorkState.STOP_REQUESTED.value)
                )
            session.commit()
        return bool(changed)

    def report_exit(
        self,
        work_id: str,
        worker_id: str,
        code: int,
        tail: str | None,
        *,
        lease_lapsed: bool = False,
    ) -> bool:
        """The work ended with `code`: exited by itself, or stopped if a stop was asked for;
        `lease_lapsed`: the node stopped it, cut off from the API past its lease. A repeat, or
        a report for work already over, changes nothing (False)."""
        now = utcnow()
        values = {
            "exit_code": code,
            "tail": tail,
            "ended_at": now,
            "updated_at": now,
            "lease_lapsed": lease_lapsed,
        }
        with self.db.session() as session:
            stopped = session.exec(
                sa.update(WorkRecord)
                .where(
                    *_mine(work_id, worker_id),
                    col(WorkRecord.state) == WorkState.STOP_REQUESTED.value,
                )
                .values(state=WorkState.STOPPED.value, **values)
            ).rowcount
            exited = session.exec(
                sa.update(WorkRecord)
                .where(
                    *_mine(work_id, worker_id),
                    col(WorkRecord.state).in_((WorkState.ASSIGNED.value, WorkState.STARTED.value)),
                )
                .values(state=WorkState.EXITED.value, **values)
            ).rowcount
            session.commit()
        return bool(stopped or exited)

    def of_job(self, job: str, epoch: int, run: str | None = None) -> list[NodeWork]:
        """The epoch's rows (of `run`; None: of any run, as before runs were recorded)."""
        with self.db.session() as session:
            rows = session.exec(
                select(WorkRecord).where(*_of(job, epoch, run)).order_by(col(WorkRecord.node_rank))
            ).all()
        return [
            NodeWork(
                rank=row.node_rank,
                vm=row.vm,
                worker_id=row.worker_id,
                state=WorkState(row.state),
                exit_code=row.exit_code,
                tail=row.tail[-4096:] if row.tail else None,
                lease_lapsed=row.lease_lapsed,
            )
            for row in rows
        ]


def current_work(worker_id: Any) -> tuple[Any, ...]:
    """The unfinished rows of a worker (`worker_id`: a value or a bind parameter) that belong
    to the job run it is reserved for or made for now. An existing worker serves one run after
    another: a row an earlier run left unfinished is never its work again, nor a row of
    another job. A worker of no run ("", from before runs were recorded) takes its job's."""
    of_worker = col(WorkerRecord.id) == worker_id
    job = sa.select(WorkerRecord.job).where(of_worker).scalar_subquery()
    run = sa.select(WorkerRecord.run).where(of_worker).scalar_subquery()
    return (
        col(WorkRecord.worker_id) == worker_id,
        col(WorkRecord.state).in_(UNFINISHED),
        col(WorkRecord.job) == job,
        sa.or_(run == NO_RUN, col(WorkRecord.run) == run),
    )


# By when a row was written, not by epoch: one run's epochs say nothing about another's.
NEWEST_FIRST = (col(WorkRecord.created_at).desc(), col(WorkRecord.epoch).desc())


def _of(job: str, epoch: int, run: str | None) -> tuple[Any, ...]:
    """The rows of the job's epoch, of one run unless `run` is None."""
    rows = (col(WorkRecord.job) == job, col(WorkRecord.epoch) == epoch)
    return rows if run is None else (*rows, col(WorkRecord.run) == run)


def _mine(work_id: str, worker_id: str) -> tuple[Any, Any]:
    return col(WorkRecord.id) == work_id, col(WorkRecord.worker_id) == worker_id
