"""The nodes' side of the jobs that run, played through the database as a node's agent would.

Every 0.2 s the player reads the work rows of the run's jobs that run: it reports an assigned
row started, a started row exited when the job's `Work` says so (chaos/mix.py), a stop request
stopped (code 143, as after SIGTERM); and wakes the job with the `workers_changed` signal, as
the API does after a report. A killed node's machine is preempted in the cloud's ledger
(`FakeCloudState.preempt`) and the node never reports again: the job must find it lost by its
health check.

A partitioned node (chaos/mix.py; the fake cloud's `partitioned` effect) is played as its agent
would be: its work starts only once its agent has read the assignment (the ledger says so:
`FakeCloudState.agent_leases`); once it has run it as long as its `Work` says, the player cuts
its link in the ledger (`FakeCloudState.cut_off`), as it preempts a killed node's machine, and
from the cut on it reports nothing for it (no exit, no stop): it cannot reach the API.

What it saw is kept per job (`WorkLog`): every start (epoch, rank), every exit the database
accepted, the kill, every read at which two epochs of one job had unfinished rows at once
(which must never happen: a new epoch is assigned only after the old one was given up), and
when each work ran (`Run`, wall-clock time). `work_intervals` turns those into the time each work
may have run, from its start (just before the player reported it) to:
- its exit or stop, once the database accepted the report;
- for a killed node, the kill (its machine taken back);
- for a partitioned node cut off before it reported an end, the time its agent says its work
  stopped (the last answered heartbeat's send time, that answer's lease, the grace its
  assignment gives), or its machine's end if sooner (the ledger's deletion plus the delete
  delay);
- for a work given up without a report (abandoned), the moment the player saw that plus one
  heartbeat interval and the stop grace (a connected agent hears it at its next heartbeat and
  stops the work), or its machine's end if sooner;
- otherwise its machine's end, or never (an open interval, counted as overlapping anything
  later).
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
from providers.fake.state import AgentLease, InstanceRow

POLL = 0.2
STOPPED_CODE = 143  # 128 + SIGTERM
FINAL = (WorkState.EXITED.value, WorkState.STOPPED.value, WorkState.ABANDONED.value)


@dataclass
class Run:
    """One node's work of one epoch, as the player saw it (time.time())."""

    epoch: int
    rank: int
    vm: str | None
    started: float
    ended: float | None = None  # its end reported (and accepted), or its kill
    how: str = ""  # exited / stopped / killed
    given_up: float | None = None  # first seen final without a report of the player's


@dataclass(frozen=True)
class Interval:
    """When a work may have run: [start, end] (end None: no end known, it may run still)."""

    epoch: int
    rank: int
    start: float
    end: float | None
    how: str  # what its end is: exited / stopped / killed / cut off / given up / machine gone
    cut: bool = False  # its node was cut off from the API while it ran

    def overlaps(self, other: Interval) -> float:
        """Seconds the two have in common (0.0: none; inf where one has no end)."""
        ends = [end for end in (self.end, other.end) if end is not None]
        if len(ends) < 2:
            start = max(self.start, other.start)
            return float("inf") if not ends or ends[0] > start else 0.0
        return max(0.0, min(ends) - max(self.start, other.start))


@dataclass
class WorkLog:
    starts: list[tuple[int, int]] = field(default_factory=list)  # (epoch, rank), in order
    exits: list[tuple[int, int, int]] = field(default_factory=list)  # (epoch, rank, code)
    stops: list[tuple[int, int]] = field(default_factory=list)
    kill: tuple[int, int, str, tuple[str, ...]] | None = None  # epoch, rank, vm, instances
    overlaps: list[str] = field(default_factory=list)
    started_at: dict[str, float] = field(default_factory=dict)  # work id -> monotonic time
    killed: set[str] = field(default_factory=set)  # work ids of killed nodes
    runs: dict[str, Run] = field(default_factory=dict)  # work id -> when it ran
    cut: set[str] = field(default_factory=set)  # work ids running when their node was cut off

    def describe(self) -> str:
        parts = [f"started {sorted(self.starts)}"]
        if self.exits:
            parts.append(f"exits {sorted(self.exits)}")
        if self.stops:
            parts.append(f"stopped {sorted(self.stops)}")
        if self.kill is not None:
            epoch, rank, vm, _ = self.kill
            parts.append(f"killed node {rank} of epoch {epoch} ({vm})")
        cut = sorted((r.epoch, r.rank) for w, r in self.runs.items() if w in self.cut)
        if cut:
            parts.append(f"cut off while running {cut}")
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
        self._partitioned: dict[str, AgentLease] = {}  # VM -> its agent's lease, this read

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
        if any(self.works[job].ending == "partition" for job in jobs):
            state = FakeCloudState(self.state_path)
            try:
                self._partitioned = {lease.vm: lease for lease in state.agent_leases()}
            finally:
                state.close()
        news = set()
        for job in jobs:
            mine = sorted((r for r in rows if r.job == job), key=lambda r: (r.epoch, r.node_rank))
            self._check_epochs(job, mine)
            # An epoch with a partitioned node runs until the job gives it up.
            held = {row.epoch for row in mine if row.vm in self._partitioned}
            if any([self._step(job, row, row.epoch in held) for row in mine]):
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

    def _step(self, job: str, row: WorkRecord, held: bool = False) -> bool:
        """One row, as its node's agent: True when something was reported. `held`: its epoch
        has a partitioned node, and runs until the job gives it up."""
        log, work = self.logs[job], self.works[job]
        run = log.runs.get(row.id)
        if run is not None and row.state in FINAL and run.ended is None and run.given_up is None:
            run.given_up = time.time()
        partition = self._partitioned.get(row.vm or "")
        if partition is not None and _is_cut(partition):
            if run is not None and run.ended is None and row.id not in log.cut:
                log.cut.add(row.id)
                stops = partition.work_stops_at
                self.event(
                    f"node {row.node_rank} of {job} cut off from the API while running its "
                    f"work (epoch {row.epoch}, {row.vm}); its lease and grace end "
                    + (f"in {stops - time.time():.1f}s" if stops is not None else "unknown")
                )
            return False  # cut off: nothing it says arrives
        if row.state == WorkState.ASSIGNED.value:
            if partition is not None and partition.work_id != row.id:
                return False  # its agent has not read the assignment yet
            at = time.time()
            if not self.work.report_started(row.id, row.worker_id):
                return False
            log.starts.append((row.epoch, row.node_rank))
            log.started_at[row.id] = time.monotonic()
            log.runs[row.id] = Run(row.epoch, row.node_rank, row.vm, at)
            return True
        if row.id in log.killed:
            return False  # a killed node says nothing more
        if row.state == WorkState.STOP_REQUESTED.value:
            if not self.work.report_exit(row.id, row.worker_id, STOPPED_CODE, "terminated\n"):
                return False
            log.stops.append((row.epoch, row.node_rank))
            self._ended(log, row, "stopped")
            return True
        if row.state != WorkState.STARTED.value or row.id not in log.started_at:
            return False
        ran = time.monotonic() - log.started_at[row.id]
        if partition is not None and ran >= work.cut_after:
            self._cut(partition)
            return False
        code = None if held else _exit_now(work, log, row, ran)
        if code == "kill":
            self._kill(job, row)
            return False
        if code is None:
            return False
        tail = f"node {row.node_rank} of {job} ends with {code}\n"
        if not self.work.report_exit(row.id, row.worker_id, code, tail):
            return False
        log.exits.append((row.epoch, row.node_rank, code))
        self._ended(log, row, "exited")
        return True

    def _cut(self, partition: AgentLease) -> None:
        """The node's link to the API is cut for good (its agent reads that in the ledger)."""
        state = FakeCloudState(self.state_path)
        try:
            state.cut_off(partition.id)
        finally:
            state.close()

    @staticmethod
    def _ended(log: WorkLog, row: WorkRecord, how: str) -> None:
        run = log.runs.get(row.id)
        if run is not None and run.ended is None:
            run.ended, run.how = time.time(), how

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
        self._ended(log, row, "killed")
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


def work_intervals(
    log: WorkLog,
    machines: list[InstanceRow],
    partitions: list[AgentLease],
    *,
    delete_delay: float,
    hears_within: float,
) -> list[Interval]:
    """When each work of a job may have run (see the module's docstring), from what the player
    saw of it (`log`), the ledger's `machines` (the job's instance rows) and `partitions` (its
    partitioned agents' leases); `hears_within`: the heartbeat interval and the stop grace."""
    gone: dict[str, float] = {}
    for machine in machines:
        if machine.deleted_at is not None:
            end = machine.deleted_at + delete_delay
            gone[machine.vm] = max(end, gone.get(machine.vm, end))
    cut = {lease.vm: lease for lease in partitions}
    spans = []
    for work_id, run in sorted(log.runs.items(), key=lambda item: item[1].started):
        machine_end = gone.get(run.vm or "")
        if run.ended is not None:
            end, how = run.ended, run.how
        elif work_id in log.cut and run.vm in cut:
            end, how = _earlier(cut[run.vm].work_stops_at, machine_end, "cut off")
        elif run.given_up is not None:
            end, how = _earlier(run.given_up + hears_within, machine_end, "given up")
        else:
            end, how = machine_end, "machine gone" if machine_end else "no end known"
        spans.append(Interval(run.epoch, run.rank, run.started, end, how, cut=work_id in log.cut))
    return spans


def _is_cut(partition: AgentLease) -> bool:
    return partition.cut_at is not None and time.time() >= partition.cut_at


def _earlier(first: float | None, second: float | None, how: str) -> tuple[float | None, str]:
    """The earlier of two ends (None: unknown), and which it was."""
    if second is not None and (first is None or second < first):
        return second, "machine gone"
    return first, how


def _exit_now(work: Work, log: WorkLog, row: WorkRecord, ran: float) -> int | str | None:
    """What the node does now: exit with a code, be killed ("kill"), or go on (None)."""
    if ran < work.after + 0.3 * row.node_rank:
        return None
    if work.ending == "until_stopped":
        return None
    if work.ending == "partition":
        return 0  # an epoch with no node cut off (the next one) runs to its end
    if work.ending == "kill":
        if log.kill is None:
            return "kill" if row.node_rank == work.rank else None
        return 0 if row.epoch > log.kill[0] else None  # the next epoch runs to its end
    if work.code == 0:
        return 0
    return work.code if row.node_rank == work.rank else None
