"""The nodes' side of the jobs that run, played through the database as a node's agent would.

Every 0.2 s the player reads the work rows of the run's jobs that run: it reports an assigned
row started, a started row exited when the job's `Work` says so (chaos/mix.py), a stop request
stopped (code 143, as after SIGTERM); and wakes the job with the `workers_changed` signal, as
the API does after a report. A killed node's machine is preempted in the cloud's ledger
(`FakeCloudState.preempt`) and the node never reports again: the job must find it lost by its
health check.

What it saw is kept per job (`WorkLog`): every start (epoch, rank), every exit the database
accepted, the kill, and every read at which two epochs of one job had unfinished rows at once
(which must never happen: a new epoch is assigned only after the old one was given up).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sqlmodel import col, select

from chaos.mix import Work
from gpuprov.models import WorkState
from gpuprov.store.db import Database, WorkRecord
from gpuprov.store.work import UNFINISHED, WorkRecords
from providers.fake import FakeCloudState

POLL = 0.2
STOPPED_CODE = 143  # 128 + SIGTERM


@dataclass
class WorkLog:
    starts: list[tuple[int, int]] = field(default_factory=list)  # (epoch, rank), in order
    exits: list[tuple[int, int, int]] = field(default_factory=list)  # (epoch, rank, code)
    stops: list[tuple[int, int]] = field(default_factory=list)
    kill: tuple[int, int, str, tuple[str, ...]] | None = None  # epoch, rank, vm, instances
    overlaps: list[str] = field(default_factory=list)
    started_at: dict[str, float] = field(default_factory=dict)  # work id -> monotonic time
    killed: set[str] = field(default_factory=set)  # work ids of killed nodes

    def describe(self) -> str:
        parts = [f"started {sorted(self.starts)}"]
        if self.exits:
            parts.append(f"exits {sorted(self.exits)}")
        if self.stops:
            parts.append(f"stopped {sorted(self.stops)}")
        if self.kill is not None:
            epoch, rank, vm, _ = self.kill
            parts.append(f"killed node {rank} of epoch {epoch} ({vm})")
        return "; ".join(parts)


class NodePlayer:
    def __init__(
        self,
        db: Database,
        state_path: str,
        works: dict[str, Work],
        open_jobs: Callable[[], set[str]],
        signal: Callable[[str], Awaitable[None]],
        event: Callable[[str], None],
    ) -> None:
        self.work = WorkRecords(db)
        self.state_path = state_path
        self.works = works  # job -> what its nodes do
        self.open_jobs = open_jobs  # the submitted jobs not yet ended
        self.signal = signal
        self.event = event
        self.logs = {job: WorkLog() for job in works}
        self._signals: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    async def run(self) -> None:
        try:
            while True:
                jobs = sorted(self.open_jobs() & set(self.works))
                if jobs:
                    for job in await asyncio.to_thread(self._play, jobs):
                        self._wake(job)
                await asyncio.sleep(POLL)
        finally:
            for task in self._signals.values():
                task.cancel()

    def _play(self, jobs: list[str]) -> set[str]:
        """One read of every row of `jobs`, each row stepped; the jobs that had news."""
        with self.work.db.session() as session:
            query = select(WorkRecord).where(col(WorkRecord.job).in_(jobs))
            rows = list(session.exec(query).all())
        news = set()
        for job in jobs:
            mine = sorted((r for r in rows if r.job == job), key=lambda r: (r.epoch, r.node_rank))
            self._check_epochs(job, mine)
            if any([self._step(job, row) for row in mine]):
                news.add(job)
        return news

    def unfinished(self) -> dict[str, list[str]]:
        """job -> its work rows still assigned, started or stop_requested (read once the jobs
        have ended: nothing should still be running, or be waited for)."""
        with self.work.db.session() as session:
            query = select(WorkRecord).where(
                col(WorkRecord.job).in_(list(self.works)), col(WorkRecord.state).in_(UNFINISHED)
            )
            rows = list(session.exec(query).all())
        left: dict[str, list[str]] = {}
        for row in sorted(rows, key=lambda r: (r.job, r.epoch, r.node_rank)):
            said = f"epoch {row.epoch} node {row.node_rank} {row.state}"
            left.setdefault(row.job, []).append(said)
        return left

    def _check_epochs(self, job: str, rows: list[WorkRecord]) -> None:
        unfinished = sorted({row.epoch for row in rows if row.state in UNFINISHED})
        if len(unfinished) > 1:
            states = ", ".join(f"e{r.epoch}/n{r.node_rank} {r.state}" for r in rows)
            self.logs[job].overlaps.append(f"epochs {unfinished} unfinished at once: {states}")

    def _step(self, job: str, row: WorkRecord) -> bool:
        """One row, as its node's agent: True when something was reported."""
        log, work = self.logs[job], self.works[job]
        if row.state == WorkState.ASSIGNED.value:
            if not self.work.report_started(row.id, row.worker_id):
                return False
            log.starts.append((row.epoch, row.node_rank))
            log.started_at[row.id] = time.monotonic()
            return True
        if row.id in log.killed:
            return False  # a killed node says nothing more
        if row.state == WorkState.STOP_REQUESTED.value:
            if not self.work.report_exit(row.id, row.worker_id, STOPPED_CODE, "terminated\n"):
                return False
            log.stops.append((row.epoch, row.node_rank))
            return True
        if row.state != WorkState.STARTED.value or row.id not in log.started_at:
            return False
        ran = time.monotonic() - log.started_at[row.id]
        code = _exit_now(work, log, row, ran)
        if code == "kill":
            self._kill(job, row)
            return False
        if code is None:
            return False
        tail = f"node {row.node_rank} of {job} ends with {code}\n"
        if not self.work.report_exit(row.id, row.worker_id, code, tail):
            return False
        log.exits.append((row.epoch, row.node_rank, code))
        return True

    def _kill(self, job: str, row: WorkRecord) -> None:
        """The node's machine is taken back by the cloud; its agent is gone with it."""
        state = FakeCloudState(self.state_path)
        try:
            ids = tuple(r.id for r in state.instances(vm=row.vm) if r.deleted_at is None)
            for instance_id in ids:
                state.preempt(instance_id)
        finally:
            state.close()
        log = self.logs[job]
        log.killed.add(row.id)
        log.kill = (row.epoch, row.node_rank, row.vm or "?", ids)
        self.event(f"killed node {row.node_rank} of {job} (epoch {row.epoch}, {row.vm}, {ids})")

    def _wake(self, job: str) -> None:
        """`workers_changed` to the job; one signal in flight per job, repeated if needed."""
        task = self._signals.get(job)
        if task is not None and not task.done():
            self._again.add(job)
            return
        self._signals[job] = asyncio.ensure_future(self._send(job))

    async def _send(self, job: str) -> None:
        while True:
            self._again.discard(job)
            with contextlib.suppress(Exception):  # an ended job needs no wake-up
                await self.signal(job)
            if job not in self._again:
                return


def _exit_now(work: Work, log: WorkLog, row: WorkRecord, ran: float) -> int | str | None:
    """What the node does now: exit with a code, be killed ("kill"), or go on (None)."""
    if ran < work.after + 0.3 * row.node_rank:
        return None
    if work.ending == "until_stopped":
        return None
    if work.ending == "kill":
        if log.kill is None:
            return "kill" if row.node_rank == work.rank else None
        return 0 if row.epoch > log.kill[0] else None  # the next epoch runs to its end
    if work.code == 0:
        return 0
    return work.code if row.node_rank == work.rank else None
