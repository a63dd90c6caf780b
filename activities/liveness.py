"""Worker liveness: the sweep that notices silent workers and wakes their jobs, and the read a
woken job makes.

- sweep_liveness (run by workflows/liveness.py's WatchWorkers, from the Schedule
  "gpuprov-liveness"): every alive worker not seen for `lost_after_seconds` becomes lost; then
  every worker whose liveness or health changed since its job was last told (store/liveness.py)
  gets its job `job-<job>` sent the signal `workers_changed`, through this worker's Temporal
  client (as the reconciler queries jobs), once per job however many of its workers changed. A
  job that is closed or not found is skipped, and the change counts as told: nobody is left to
  tell. A signal Temporal did not take stays pending for the next sweep.
- job_workers (a job's local step): every worker the database ties to the job, with its
  liveness, health, lease and the cloud's notice, the truth the job acts on. The signal
  carries nothing and changes nothing by itself, so anyone who can send it can at most wake a
  job to read this.

Heartbeats never reach Temporal one by one: only a change of a worker's state costs one signal
(one history event) to its job.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import datetime, timedelta

from pydantic import Field, ValidationError
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuprov.models import NodeNotice, WorkerLiveness
from gpuprov.sdk.signals import tell_workers_changed
from gpuprov.store.db import WorkerRecord
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records
from providers.base import Model
from providers.errors import truncate

MAX_NOTIFIED_PER_SWEEP = 1000  # workers; the rest wait for the next sweep
PARALLEL_SIGNALS = 20
MAX_LINES = 50


class SweepInput(Model):
    lost_after_seconds: float = Field(default=90.0, gt=0)


class SweepReport(Model):
    lost: list[str] = Field(default_factory=list)  # worker ids marked lost by this sweep
    signalled: list[str] = Field(default_factory=list)  # jobs sent workers_changed
    skipped: list[str] = Field(default_factory=list)  # jobs closed or not found
    errors: list[str] = Field(default_factory=list)  # signals Temporal did not take (retried)


class JobWorkersInput(Model):
    job: str
    run: str | None = None  # the job's run (gpuprov/store/runs.py); None: sent before runs were


def worker_liveness(worker: WorkerRecord) -> WorkerLiveness:
    return WorkerLiveness(
        worker_id=worker.id,
        vm=worker.vm,
        origin=worker.origin,
        state=worker.state,
        liveness=worker.liveness,
        health=worker.health,
        detail=worker.health_detail,
        last_seen_at=worker.last_seen_at,
        work_ends_by=worker.work_ends_by,
        notice=_notice(worker.notice),
    )


def _notice(stored: str | None) -> NodeNotice | None:
    """The notice the API recorded, or None (none, or one another version wrote unreadably)."""
    if not stored:
        return None
    try:
        return NodeNotice.model_validate_json(stored)
    except ValidationError:
        return None


class LivenessActivities:
    def __init__(self, records: Records, client: Client) -> None:
        self._liveness = Liveness(records.db)
        self._client = client

    def all(self) -> list[object]:
        return [self.sweep_liveness, self.job_workers]

    @activity.defn(name="job_workers")
    async def job_workers(self, request: JobWorkersInput) -> list[WorkerLiveness]:
        rows = await asyncio.to_thread(self._liveness.of_job, request.job, request.run)
        return [worker_liveness(row) for row in rows]

    @activity.defn(name="sweep_liveness")
    async def sweep_liveness(self, request: SweepInput) -> SweepReport:
        report = SweepReport()
        lost_after = timedelta(seconds=request.lost_after_seconds)
        lost = await asyncio.to_thread(self._liveness.mark_lost, lost_after)
        report.lost = [worker.id for worker in lost][:MAX_LINES]
        pending = await asyncio.to_thread(self._liveness.pending, MAX_NOTIFIED_PER_SWEEP)
        by_job: dict[str, list[WorkerRecord]] = defaultdict(list)
        for worker in pending:
            assert worker.job is not None  # pending() reads only workers of a job
            by_job[worker.job].append(worker)
        gate = asyncio.Semaphore(PARALLEL_SIGNALS)

        async def tell(job: str, workers: list[WorkerRecord]) -> None:
            async with gate:
                outcome = await self._signal(job)
            if outcome is None:
                return
            (report.signalled if outcome else report.skipped).append(job)
            told = [(worker.id, worker.changed_at) for worker in workers]
            await asyncio.to_thread(self._record_told, told)

        await asyncio.gather(*(tell(job, workers) for job, workers in sorted(by_job.items())))
        for job in sorted(set(by_job) - {*report.signalled, *report.skipped}):
            if len(report.errors) < MAX_LINES:
                report.errors.append(f"job {job}: workers_changed not delivered, next sweep")
        report.signalled.sort()
        report.skipped.sort()
        return report

    async def _signal(self, job: str) -> bool | None:
        """True: signalled; False: the job is closed or unknown; None: Temporal did not take it
        (logged; the change stays pending)."""
        try:
            await tell_workers_changed(self._client, job)
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:  # closed, or never started
                return False
            activity.logger.warning(
                "workers_changed to job %s not delivered: %s", job, truncate(error.message, 300)
            )
            return None
        return True

    def _record_told(self, told: list[tuple[str, datetime | None]]) -> None:
        for worker_id, changed_at in told:
            if changed_at is not None:
                self._liveness.notified(worker_id, changed_at)
