"""One chaos run, start to finish.

1. Plan (all from the seed, chaos/plan.py): job sizes, arrival times and roles (leases, jobs
   that run, hostile starts, the largest job, cancel points: chaos/mix.py), the fault rules, the
   disruption schedule (worker SIGKILLs and dev server restarts, at random moments inside the
   arrival window) and every pause length.
2. Start a Temporal dev server on a SQLite file, the control-plane API in this process, and the
   worker as a subprocess (its fake cloud's state in a file, simulated node agents on). With
   `--workers N`, N worker processes poll the task queue, each with a data dir of its own (as
   on separate hosts) and each killed on its own; with `--database postgresql` the workers and
   the API share a scratch PostgreSQL database (chaos/postgres.py) instead of a SQLite file.
3. Submit the jobs as they arrive (a hostile one as a raw start: chaos/hostile.py); release
   every lease that reaches ready, cancel the chosen ones at their points (chaos/cancels.py),
   play the nodes of the jobs that run (chaos/nodes.py), and disrupt on schedule. The last job
   is submitted only once every disruption is done, so all of them happen while jobs are
   running. The worker is supervised: if it exits on its own it is restarted (and that is
   reported). The liveness sweep runs as in production, from its Schedule (gpuprov-liveness,
   every 2 s here: chaos/faults.py `Timings`): a node whose agent is silent for `lost_after` is
   lost, and a job that runs on it restarts or fails.
4. Wait until every job is terminal, with a deadline; a job still open then fails the run.
5. Calm the cloud (the worker restarts without fault rules), read every job's final status,
   snapshot the cloud's ledger, run ONE reconcile pass (the Reconcile workflow), snapshot again
   and check (chaos/checks.py; the roles' verdicts: chaos/hostile.py, chaos/cancels.py,
   chaos/runs.py).

Every RPC the harness makes is retried across a server restart. Every process it started is
stopped in `finally`, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from sqlmodel import col, select
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from chaos.cancels import cancel_at_point, judge_cancels
from chaos.checks import leftovers, resolved_orphans, standard_checks
from chaos.faults import FaultPlan, Timings, worker_config
from chaos.hostile import judge_hostile, start_hostile
from chaos.nodes import NodePlayer
from chaos.partitions import judge_overlaps, leases_by_job, lost_workers
from chaos.plan import Disruption, JobRun, Options, job_spec, make_plan
from chaos.postgres import ScratchPostgres
from chaos.processes import DevServer, WorkerProcess
from chaos.report import Check, JobOutcome, Summary
from chaos.runs import judge_largest, judge_runs
from chaos.stalls import THRESHOLD, JobTimes, find_stalls, stall_lines
from chaos.workers import OTHER, SPREAD_JOBS_PER_WORKER, polling_pids, tasks_by_worker
from gpuprov import contract
from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.engine.schedules import apply_liveness_schedule
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState, workflow_id_for
from gpuprov.sdk.client import GpuprovClient, GpuprovError, JobAlreadyExists, JobHandle, JobNotFound
from gpuprov.store.db import WorkRecord
from gpuprov.store.records import Records
from providers.fake import FakeCloudState

# Work rows in these states still say a node is (or may be) running the job's work.
OPEN_WORK_STATES = ("assigned", "started", "stop_requested")
T = TypeVar("T")

RETRYABLE = {
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.UNKNOWN,
    RPCStatusCode.INTERNAL,
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.CANCELLED,
    RPCStatusCode.ABORTED,
}
CLOSED = {
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued_as_new",
}
WATCH_INTERVAL = 1.0  # one visibility list call per interval for every job
DESCRIBE_SWEEP = 10.0  # and a describe of each open job this often (visibility may lag)
RECONCILE_TIMEOUT = timedelta(minutes=3)


class ChaosRun:
    def __init__(self, options: Options, timings: Timings | None = None) -> None:
        self.options = options
        self.timings = timings or Timings()
        self.plan = make_plan(options, self.timings)
        self.summary = Summary(
            command=options.command,
            seed=options.seed,
            jobs_requested=options.jobs,
            kills_requested=options.kills,
            restarts_requested=options.server_restarts,
        )
        self.data_dir = Path(tempfile.mkdtemp(prefix="gpuprov-chaos-"))
        self.task_queue = f"chaos-{options.seed}-{uuid.uuid4().hex[:8]}"
        self.database_url = f"sqlite:///{self.data_dir / 'gpuprov.db'}"
        self.state_path = self.data_dir / "fake-cloud.db"
        self.config_path = self.data_dir / "gpuprov.toml"  # with the fault rules
        self.calm_config_path = self.data_dir / "gpuprov-calm.toml"  # without
        self.server = DevServer(self.data_dir, free_port())
        self.workers = _worker_processes(options.workers, self.config_path, self.data_dir)
        self.postgres = (
            ScratchPostgres(options.postgres_url, keep=options.keep)
            if options.database == "postgresql"
            else None
        )
        self.api_port = free_port()
        self.client: Client | None = None
        self.records: Records | None = None
        self.worker_lock = asyncio.Lock()
        self.server_up = asyncio.Event()
        self.disruptions_done = asyncio.Event()
        self.all_submitted = asyncio.Event()
        self.started = 0.0
        self.epoch0 = 0.0  # time.time() when the run started (history timestamps)
        self.disruption_log: list[tuple[float, str]] = []
        self.arrivals_start = 0.0
        self._tasks: list[asyncio.Task[Any]] = []
        self._supervisor: asyncio.Future[Any] | None = None
        self._starting: list[asyncio.Task[Any]] = []  # hostile starts (an impostor waits)
        self.player: NodePlayer | None = None  # plays the nodes of the jobs that run
        self.polling: set[int] = set()  # pids seen polling the task queue in the chaos phase

    # ------------------------------------------------------------------ helpers

    def now(self) -> float:
        return time.monotonic() - self.started

    def event(self, text: str) -> None:
        line = f"t+{self.now():7.1f}s {text}"
        self.summary.timeline.append(line)
        print(f"chaos: {line}", file=sys.stderr, flush=True)

    async def retrying(
        self, what: str, call: Callable[[], Awaitable[T]], timeout: float = 180.0
    ) -> T:
        """`call()` until it answers; RPC failures from a server that is down are retried."""
        deadline = time.monotonic() + timeout
        pause = 0.2
        while True:
            try:
                return await call()
            except RPCError as error:
                if error.status not in RETRYABLE or time.monotonic() > deadline:
                    raise
                last = f"{error.status.name if error.status else '?'}: {error.message}"
            except (JobNotFound, JobAlreadyExists):
                raise
            except GpuprovError as error:  # the SDK wraps RPC failures in GpuprovError
                if time.monotonic() > deadline:
                    raise
                last = str(error)
            self.summary.rpc_retries += 1
            if pause >= 1.6:
                print(f"chaos: retrying {what}: {last[:160]}", file=sys.stderr, flush=True)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    def job_named(self, name: str) -> JobRun:
        return next(job for job in self.plan.jobs if job.name == name)

    def release_now(self, job: JobRun) -> None:
        job.released = True
        self._spawn(self._release(job), f"release {job.name}")

    @property
    def gpuprov(self) -> GpuprovClient:
        assert self.client is not None
        return GpuprovClient(self.client, self.task_queue)

    def write_config(self, *, calm: bool) -> None:
        worker_config(
            self.calm_config_path if calm else self.config_path,
            temporal_address=self.server.address,
            task_queue=self.task_queue,
            database_url=self.database_url,
            api_port=self.api_port,
            state_path=self.state_path,
            timings=self.timings,
            faults=[] if calm else self.plan.faults.rules(),
        )

    # ------------------------------------------------------------------ the run

    async def run(self) -> Summary:
        self.started = time.monotonic()
        self.epoch0 = time.time()
        self.event(
            f"run directory {self.data_dir}; {len(self.plan.faults.faults)} fault rules; "
            f"disruptions: " + ", ".join(_describe(d, self.options) for d in self.plan.disruptions)
        )
        failed = True
        try:
            if self.postgres is not None:
                self.database_url = await self.postgres.start()
                self.event(f"{self.postgres.describe()}, shared by the workers and the API")
            self.write_config(calm=False)
            self.server.start()
            self.client = await self.server.wait_ready(None)
            self.server_up.set()
            self.records = open_records(self.database_url)
            timings = self.timings
            app = create_app(self.records, workers=timings.workers(), jobs=timings.jobs())
            await apply_liveness_schedule(self.client, self.task_queue, timings.workers())
            self.event(
                f"liveness: heartbeats every {timings.heartbeat_interval:g}s, lost after "
                f"{timings.lost_after:g}s, lease {timings.lease:g}s, stop grace "
                f"{timings.stop_grace:g}s; the sweep's Schedule every {timings.sweep_every}s"
            )
            async with serving(app, "127.0.0.1", self.api_port):
                try:
                    await self._chaos_phase()
                    await self._final_phase()
                finally:
                    await self._stop_tasks(supervisor=True)
                    self._stop_workers()
            failed = not self.summary.passed
        except BaseException as error:
            self.summary.checks.append(
                Check("the harness ran to the end", False, f"{type(error).__name__}: {error}")
            )
            raise
        finally:
            await self._stop_tasks(supervisor=True)
            self._stop_workers()
            self.server.stop()
            if self.records is not None:
                self.records.db.dispose()
            if self.postgres is not None:
                self.postgres.stop()
            self.summary.elapsed = self.now()
            if failed or self.options.keep:
                self.summary.data_dir = str(self.data_dir)
            else:
                shutil.rmtree(self.data_dir, ignore_errors=True)
        return self.summary

    async def _stop_tasks(self, supervisor: bool = False) -> None:
        tasks, self._tasks = self._tasks, []
        if supervisor and self._supervisor is not None:
            tasks.append(self._supervisor)  # type: ignore[arg-type]
            self._supervisor = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _spawn(self, coroutine: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coroutine)
        task.set_name(name)
        self._tasks.append(task)
        return task

    def _stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()

    async def _chaos_phase(self) -> None:
        async with self.worker_lock:
            for worker in self.workers:
                worker.start()
                self.event(f"{worker.name} started (pid {worker.pid})")
        self.arrivals_start = time.monotonic()
        # The supervisor outlives the chaos phase: the final phase needs a worker too.
        self._supervisor = asyncio.ensure_future(self._supervise_worker())
        monkey = self._spawn(self._disrupt(), "monkey")
        submitter = self._spawn(self._submit_all(), "submitter")
        if len(self.workers) > 1:
            self._spawn(self._watch_pollers(), "pollers")
        self._play_nodes()
        await self._watch_until_terminal()
        for task in (monkey, submitter):
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    def _play_nodes(self) -> None:
        """The nodes of the jobs that run, played through the database (chaos/nodes.py)."""
        works = {job.name: job.role.work for job in self.plan.jobs if job.role.work is not None}
        if not works:
            return
        assert self.records is not None and self.client is not None
        client = self.client

        def open_jobs() -> set[str]:
            return {job.name for job in self.plan.jobs if job.submitted_at and not job.state}

        async def wake(name: str) -> None:
            handle = client.get_workflow_handle(workflow_id_for(name))
            await self.retrying(
                f"wake {name}", lambda: handle.signal(contract.JOB_WORKERS_CHANGED), 60
            )

        self.player = NodePlayer(
            self.records.db, str(self.state_path), works, open_jobs, wake, self.event
        )
        self._spawn(self.player.run(), "nodes")

    # ------------------------------------------------------------------ disruptions

    async def _sleep_until(self, at: float) -> None:
        delay = self.arrivals_start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _supervise_worker(self) -> None:
        """A worker that exits on its own is restarted, as a service manager would."""
        while True:
            await asyncio.sleep(0.5)
            await self.server_up.wait()  # a worker cannot start while Temporal is down
            async with self.worker_lock:
                for worker in self.workers:
                    if not worker.running and worker.proc is not None:
                        self._restart_exited(worker, worker.proc.returncode)

    def _restart_exited(self, worker: WorkerProcess, code: int | None) -> None:
        self.summary.unplanned_worker_exits += 1
        self.disruption_log.append((self.now(), f"{worker.name} exit on its own ({code})"))
        self.event(f"{worker.name} exited on its own (exit status {code}); restarting it")
        tail = worker.log_tail(2000).strip().splitlines()
        self.summary.findings.append(
            f"the {worker.name} exited on its own at t+{self.now():.0f}s with status {code} "
            f"(restarted); its last log line: {tail[-1][:300] if tail else '(none)'}"
        )
        worker.start()

    async def _disrupt(self) -> None:
        try:
            for disruption in self.plan.disruptions:
                await self._sleep_until(disruption.at)
                if disruption.action == "kill_worker":
                    await self._kill_worker(self.workers[disruption.worker], disruption.pause)
                else:
                    await self._restart_server(disruption)
        finally:
            self.disruptions_done.set()

    async def _kill_worker(self, worker: WorkerProcess, pause: float) -> None:
        async with self.worker_lock:
            pid = worker.pid
            worker.kill()
            self.summary.kills_done += 1
            kill = f"SIGKILL {worker.name} #{self.summary.kills_done}"
            self.disruption_log.append((self.now(), kill))
            others = len(self.workers) - 1
            running = f"{self._running_workers()}/{others} other worker(s) up; " if others else ""
            open_jobs = f"{self._open_jobs()} job(s) open"
            self.event(f"{kill} (pid {pid}); {open_jobs}; {running}down {pause:g}s")
            await asyncio.sleep(pause)
            worker.start()
        self.event(f"{worker.name} restarted (pid {worker.pid})")

    def _running_workers(self) -> int:
        return sum(1 for worker in self.workers if worker.running)

    async def _restart_server(self, disruption: Disruption) -> None:
        self.server_up.clear()
        if disruption.signal == "KILL":
            self.server.kill()
        else:
            await asyncio.to_thread(self.server.stop)
        self.summary.restarts_done += 1
        self.disruption_log.append(
            (self.now(), f"dev server SIG{disruption.signal} #{self.summary.restarts_done}")
        )
        self.event(
            f"dev server stopped with SIG{disruption.signal} (restart "
            f"#{self.summary.restarts_done}); {self._open_jobs()} job(s) open; "
            f"down {disruption.pause:g}s"
        )
        await asyncio.sleep(disruption.pause)
        self.server.start()
        await self.server.wait_ready(self.client, timeout=120)
        self.server_up.set()
        self.event("dev server back on the same database file and port")

    def _open_jobs(self) -> int:
        return sum(1 for job in self.plan.jobs if job.submitted_at is not None and not job.state)

    # ------------------------------------------------------------------ jobs

    async def _submit_all(self) -> None:
        for index, job in enumerate(self.plan.jobs):
            if index == len(self.plan.jobs) - 1:
                await self.disruptions_done.wait()  # every disruption hits a running run
            await self._sleep_until(job.arrive_at)
            await self._submit(job)
        for task in self._starting:  # an impostor starts once its real job is ready
            with contextlib.suppress(Exception):
                await task
        self.all_submitted.set()
        self.event(f"all {len(self.plan.jobs)} jobs submitted")

    async def _submit(self, job: JobRun) -> None:
        if job.role.kind == "hostile":
            self._starting.append(self._spawn(start_hostile(self, job), f"start {job.name}"))
            return
        spec = job_spec(job, self.options)

        async def submit() -> JobHandle:
            try:
                return await self.gpuprov.submit(spec)
            except JobAlreadyExists:  # an earlier try landed, its answer did not
                return self.gpuprov.job(job.name)
            except RuntimeError as error:  # the SDK's client is mid-reconnect
                raise GpuprovError(str(error)) from None

        job.submitted_wall = time.time()
        job.handle = await self.retrying(f"submit {job.name}", submit)
        job.submitted_at = time.monotonic()
        job.last_seen = "queued"
        if job.role.cancel_at is not None:
            self._spawn(cancel_at_point(self, job), f"cancel {job.name}")

    async def _release(self, job: JobRun) -> None:
        assert job.handle is not None
        handle = job.handle
        try:
            await self.retrying(f"release {job.name}", handle.release)
        except JobNotFound:
            pass  # it ended meanwhile
        except Exception as error:
            job.released = False  # look again next round
            print(f"chaos: release {job.name} failed: {error}", file=sys.stderr, flush=True)

    def _seen(self, job: JobRun, status: WorkflowExecutionStatus | None, state: str | None):
        if status is not None and status in CLOSED:
            if not job.state:
                job.state = CLOSED[status]
            return
        job.last_seen = state or job.last_seen
        if state == JobState.READY.value and not job.released and not job.held:
            self.release_now(job)

    async def _watch_until_terminal(self) -> None:
        assert self.client is not None
        client = self.client
        by_id = {job.workflow_id: job for job in self.plan.jobs}
        query = f"TaskQueue = '{self.task_queue}' AND WorkflowType = 'ProvisionJob'"
        deadline: float | None = None
        last_sweep = time.monotonic()
        while True:
            submitted = [job for job in self.plan.jobs if job.submitted_at is not None]
            open_jobs = [job for job in submitted if not job.state]
            if self.all_submitted.is_set():
                if not open_jobs:
                    self.event("every job is terminal")
                    return
                if deadline is None:
                    deadline = time.monotonic() + self.options.deadline
                elif time.monotonic() > deadline:
                    self.event(f"deadline: {len(open_jobs)} job(s) still open")
                    return
            try:
                async for execution in client.list_workflows(query):
                    job = by_id.get(execution.id)
                    if job is None or job.submitted_at is None:
                        continue
                    state = execution.typed_search_attributes.get(contract.STATE)
                    if execution.status in CLOSED and not job.state:
                        await self._confirm_closed(job)
                    else:
                        self._seen(job, None, state)
                if time.monotonic() - last_sweep > DESCRIBE_SWEEP:
                    last_sweep = time.monotonic()
                    for job in open_jobs:
                        await self._confirm_closed(job)
            except RPCError as error:
                if error.status not in RETRYABLE:
                    raise
                self.summary.rpc_retries += 1
            await asyncio.sleep(WATCH_INTERVAL)

    async def _confirm_closed(self, job: JobRun) -> None:
        """Describe is authoritative (visibility may lag); it also carries the job's state."""
        assert self.client is not None
        description = await self.client.get_workflow_handle(job.workflow_id).describe()
        state = description.typed_search_attributes.get(contract.STATE)
        was = job.state
        if description.close_time is not None:
            job.closed_wall = description.close_time.timestamp()
        self._seen(job, description.status, state)
        if job.state and not was:
            self.event(f"{job.name} ended {job.state}")

    # ------------------------------------------------------------------ the end

    async def _final_phase(self) -> None:
        await self._stop_tasks()  # no more disruptions, releases or cancels
        summary = self.summary
        # The cloud calms down: the worker restarts without fault rules for what follows.
        self.write_config(calm=True)
        async with self.worker_lock:
            await asyncio.to_thread(self._stop_workers)
            for worker in self.workers:
                worker.use_config(self.calm_config_path)
                worker.start()
        self.event("workers restarted without fault rules for the reconcile pass")
        await self._collect_final_statuses()
        await self._find_stalls()
        await asyncio.sleep(self.timings.delete_delay + 0.5)  # deletions in flight settle
        before = self._ledger()
        summary.live_before_reconcile = before["live"]
        summary.side_before_reconcile = before["side"]
        summary.orphans_before_reconcile = self._open_orphans()
        orphan_vms = self._open_orphan_vms()
        unrecorded = self._unrecorded(before["live_vms"])
        summary.open_work = self._open_work()
        await self._reconcile_once()
        await asyncio.sleep(self.timings.delete_delay + 0.5)
        after = self._ledger()
        summary.live_after = after["live"]
        summary.side_after = after["side"]
        summary.orphans_after = self._open_orphans()
        summary.orphans_resolved = resolved_orphans(
            orphan_vms, set(self._open_orphan_vms()), before, after
        )
        self._fault_stats()
        last_seen = {job.name: job.last_seen for job in self.plan.jobs}
        standard_checks(summary, after, unrecorded, last_seen, self._epoch_start())
        await self._role_checks(before, orphan_vms, after)
        await self._check_every_worker_served()

    async def _role_checks(
        self, before: dict[str, Any], orphan_vms: list[str], after: dict[str, Any]
    ) -> None:
        """The hostile starts, the cancels, the jobs that run and the largest job."""
        jobs, seed = self.plan.jobs, self.options.seed
        left = leftovers([job.name for job in jobs], before, orphan_vms, after)
        logs = self.player.logs if self.player is not None else {}
        partitions = leases_by_job(str(self.state_path))
        overlaps = None
        if self.player is not None:
            overlaps = judge_overlaps(
                self.player, jobs, after["rows"], partitions, self.timings, seed,
                self._epoch_start(),
            )  # fmt: skip
        checks = [
            judge_hostile(jobs, seed),
            await judge_cancels(self, jobs, left),
            judge_runs(jobs, logs, left, seed, partitions),
            overlaps,
            judge_largest(jobs, after["creates"], left, seed),
        ]
        self.summary.checks += [check for check in checks if check is not None]
        assert self.records is not None
        lost_workers(self.records, partitions, after["rows"], self.timings, self.summary)
        if self.player is not None:
            unfinished = await asyncio.to_thread(self.player.unfinished)
            if unfinished:
                self.summary.findings.append(
                    f"{len(unfinished)} job(s) that run ended with work rows still unfinished "
                    "(their machines are gone, the records say the work runs): "
                    + "; ".join(
                        f"{job} ({self.job_named(job).state}): {', '.join(rows)}"
                        for job, rows in sorted(unfinished.items())
                    )
                )
        for outcome, job in zip(self.summary.jobs, jobs, strict=True):
            outcome.notes = job.problems + job.notes

    async def _collect_final_statuses(self) -> None:
        limit = asyncio.Semaphore(8)

        async def one(job: JobRun) -> None:
            if job.handle is None:
                return
            handle = job.handle
            async with limit:
                with contextlib.suppress(Exception):
                    await self._confirm_closed(job)
                try:
                    job.final = await self.retrying(f"status of {job.name}", handle.status, 60)
                except Exception as error:
                    job.error = f"(final status unreadable: {error})"
                if job.final is not None:
                    job.error = job.final.error
                    job.last_seen = job.final.state.value

        await asyncio.gather(*(one(job) for job in self.plan.jobs))
        for job in self.plan.jobs:
            final = job.final
            self.summary.jobs.append(
                JobOutcome(
                    name=job.name,
                    nodes=job.nodes,
                    state=job.state or ("not submitted" if job.handle is None else "open"),
                    faults=[fault.describe() for fault in self.plan.faults.for_job(job.name)],
                    error=job.error,
                    leaks=list(final.leaks) if final else [],
                    attempts=[a.describe() for a in final.attempts] if final else [],
                    released=job.released,
                    cancel=job.cancel,
                    waiting_for=final.waiting_for if final else None,
                    role=job.role.describe(),
                )
            )

    async def _find_stalls(self) -> None:
        assert self.client is not None
        submitted = [job.workflow_id for job in self.plan.jobs if job.handle is not None]
        times, unread = await find_stalls(self.client, submitted, self.epoch0)
        summary = self.summary
        if unread:
            summary.findings.append(f"{len(unread)} job histories unreadable: {unread[:3]}")
        stalls = [stall for job_times in times for stall in job_times.stalls]
        summary.stall_count = len(stalls)
        summary.stalls = stall_lines(stalls, self.disruption_log)
        timed_out = {
            job.name
            for job in summary.jobs
            if job.state == "failed" and "provisioning timed out" in (job.error or "")
        }
        if times:
            summary.waits = _waits_line(times, timed_out)
        if not stalls and not timed_out:
            return
        stalled_jobs = {stall.job for stall in stalls}
        summary.findings.append(
            f"{len(stalls)} activity step(s) in {len(stalled_jobs)} job(s) waited more than "
            f"{THRESHOLD:g}s for their next attempt (a worker that died held them; they come "
            f"back only after their timeout: see 'stalls'); {len(timed_out)} job(s) failed by "
            f"provisioning timeout, {len(timed_out & stalled_jobs)} of them had such a stall "
            "(for the others see 'workflow task waits')"
        )

    async def _watch_pollers(self) -> None:
        """Which worker processes poll the jobs' task queue, sampled until the tasks stop."""
        assert self.client is not None
        while True:
            with contextlib.suppress(Exception):  # a server restarting: the next sample
                self.polling |= await polling_pids(self.client, self.task_queue)
            await asyncio.sleep(1.0)

    async def _check_every_worker_served(self) -> None:
        """With several workers: each one polled the jobs' task queue while they ran and, in a
        run with enough jobs to spread, ran workflow or activity tasks of them."""
        if len(self.workers) < 2:
            return
        assert self.client is not None
        names = {pid: worker.name for worker in self.workers for pid in worker.pids}
        submitted = [job.workflow_id for job in self.plan.jobs if job.handle is not None]
        tally = await tasks_by_worker(self.client, submitted, names)
        counted = [worker.name for worker in self.workers] + ([OTHER] if tally[OTHER] else [])
        polled = [w.name for w in self.workers if self.polling & set(w.pids)]
        spread = len(submitted) >= SPREAD_JOBS_PER_WORKER * len(self.workers)
        ran = all(tally[worker.name] > 0 for worker in self.workers)
        tasks = ", ".join(f"{name} {tally[name]}" for name in counted)
        rule = "required" if spread else f"not required under {SPREAD_JOBS_PER_WORKER} jobs each"
        self.summary.checks.append(
            Check(
                "every worker process polled the jobs' task queue, and ran tasks of them in a "
                "run big enough to spread",
                len(polled) == len(self.workers) and (ran or not spread),
                f"polled: {', '.join(polled) or 'none'}; tasks ({rule}): {tasks}",
            )
        )

    def _ledger(self) -> dict[str, Any]:
        state = FakeCloudState(str(self.state_path))
        try:
            live = state.live_instances(self.timings.delete_delay)
            side = state.live_side_resources()
            creates = state.creates_per_vm()
            rows = state.instances()
            calls = Counter()
            for (primitive, _region), n in state.call_counts().items():
                calls[primitive] += n
        finally:
            state.close()
        self.summary.calls = dict(calls)
        return {
            "live": [f"{r.vm} {r.id} ({r.boot_mode}, deleted_at={r.deleted_at})" for r in live],
            "live_vms": sorted({r.vm for r in live}),
            "live_ids": {vm: [r.id for r in live if r.vm == vm] for vm in {r.vm for r in live}},
            "side": [f"{vm} {region} {kind} {name}" for vm, region, kind, name in side],
            "side_vms": sorted({vm for vm, _region, _kind, _name in side}),
            "creates": creates,
            "rows": rows,
        }

    def _open_orphans(self) -> list[str]:
        assert self.records is not None
        return [
            f"{o.vm} ({o.provider}/{o.region}, attempts {o.attempts}): {o.last_error}"
            for o in self.records.open_orphans()
        ]

    def _open_orphan_vms(self) -> list[str]:
        assert self.records is not None
        return [o.vm for o in self.records.open_orphans()]

    def _unrecorded(self, live_vms: list[str]) -> list[str]:
        """Live machines no open orphan record names, once every job has ended."""
        assert self.records is not None
        recorded = {o.vm for o in self.records.open_orphans()}
        return [vm for vm in live_vms if vm not in recorded]

    def _open_work(self) -> list[str]:
        """Work rows still open (assigned, started, stop_requested) once every job has ended."""
        assert self.records is not None
        with self.records.db.session() as session:
            rows = session.exec(
                select(WorkRecord).where(col(WorkRecord.state).in_(OPEN_WORK_STATES))
            ).all()
        return [f"{row.job} epoch {row.epoch} node {row.node_rank}: {row.state}" for row in rows]

    async def _reconcile_once(self) -> None:
        summary = self.summary
        try:
            from gpuprov.contract import ReconcileInput
            from gpuprov.engine import worker as engine
        except Exception as error:
            summary.reconcile = f"reconciler unavailable: cannot import it ({error})"
            return
        names = {getattr(w, "__temporal_workflow_definition").name for w in engine.WORKFLOWS}
        if contract.RECONCILE not in names:
            summary.reconcile = (
                f"reconciler unavailable: no workflow named {contract.RECONCILE} among the worker's"
            )
            return
        assert self.client is not None
        client = self.client
        workflow_id = f"chaos-reconcile-{uuid.uuid4().hex[:8]}"
        self.event(f"reconcile pass {workflow_id}")
        try:
            report = await client.execute_workflow(
                contract.RECONCILE,
                ReconcileInput(grace_seconds=0),
                id=workflow_id,
                task_queue=self.task_queue,
                execution_timeout=RECONCILE_TIMEOUT,
                result_type=_report_type(),
            )
        except WorkflowFailureError as error:
            summary.reconcile = f"FAILED: {error.cause or error}"
            return
        except RPCError as error:
            summary.reconcile = f"FAILED: {error.status}: {error.message}"
            return
        scalars, lines = _describe_report(report)
        summary.reconcile = f"ran ({workflow_id}): {scalars}"
        summary.reconcile_detail = lines
        self.event(f"reconcile pass done: {summary.reconcile}")

    def _fault_stats(self) -> None:
        """What was planned, and what the cloud's ledger says actually fired: coverage is
        judged on the second (a rule whose call never came injected nothing)."""
        summary, plan = self.summary, self.plan.faults
        summary.fault_rules = len(plan.faults)
        summary.faults_by_effect = dict(plan.by_effect())
        state = FakeCloudState(str(self.state_path))
        try:
            fires = state.fault_fires()  # rule index -> calls it fired on
        finally:
            state.close()
        fired = FaultPlan([f for i, f in enumerate(plan.faults) if fires.get(i, 0) > 0])
        summary.fault_hits = sum(fires.values())
        summary.fault_rules_fired = len(fired.faults)
        summary.fired_by_effect = dict(fired.by_effect())
        summary.fired_by_primitive = dict(fired.by_primitive())
        summary.fired_kinds = dict(fired.error_kinds())
        summary.deck_not_fired = [
            fault.describe()
            for index, fault in enumerate(plan.faults)
            if fault.coverage and not fires.get(index)
        ]
        summary.deck_size = sum(1 for fault in plan.faults if fault.coverage)

    # ------------------------------------------------------------------ checks

    def _job(self, name: str) -> JobRun:
        return next(job for job in self.plan.jobs if job.name == name)

    def _epoch_start(self) -> float:
        return time.time() - (time.monotonic() - self.started)


def _worker_processes(count: int, config: Path, data_dir: Path) -> list[WorkerProcess]:
    """One worker as ever (worker.log); several each with a data dir and a log of their own."""
    if count == 1:
        return [WorkerProcess(config, data_dir / "worker.log", name="worker")]
    return [
        WorkerProcess(
            config,
            data_dir / f"worker-{n}.log",
            name=f"worker {n}",
            data_dir=data_dir / f"worker-{n}",
        )
        for n in range(1, count + 1)
    ]


def _describe(disruption: Disruption, options: Options) -> str:
    if disruption.action == "kill_worker" and options.workers > 1:
        return f"kill_worker {disruption.worker + 1}@{disruption.at:.1f}s"
    return f"{disruption.action}@{disruption.at:.1f}s"


def _waits_line(times: list[JobTimes], timed_out: set[str]) -> str:
    """How long workflow tasks waited for a worker, overall and for the timed-out jobs."""
    waits = sorted(times, key=lambda t: t.wft_wait)
    total = sum(t.wft_wait for t in waits)
    slowest = waits[-1]
    line = (
        f"total {total:.0f}s over {len(waits)} jobs (mean {total / len(waits):.1f}s, "
        f"max {slowest.wft_wait:.0f}s in {slowest.job}); "
        f"workflow task timeouts {sum(t.wft_timeouts for t in waits)}"
    )
    late = [t for t in waits if t.job in timed_out]
    if late:
        mean = sum(t.wft_wait for t in late) / len(late)
        line += f"; the {len(late)} job(s) that hit their provisioning timeout: mean {mean:.1f}s"
    return line


def _report_type() -> Any:
    try:
        from gpuprov.contract import ReconcileReport
    except ImportError:
        return None
    return ReconcileReport


def _describe_report(report: Any) -> tuple[str, list[str]]:
    """The report as "name=value, ..." and one line per listed item, whatever its shape."""
    if report is None:
        return "no report", []
    if hasattr(report, "model_dump"):
        data = report.model_dump(mode="json")
    elif isinstance(report, dict):
        data = report
    else:
        return repr(report)[:300], []
    scalars, lines = [], []
    for key, value in data.items():
        if isinstance(value, list):
            scalars.append(f"{key}={len(value)}")
            lines += [f"{key}: {str(item)[:300]}" for item in value[:30]]
        else:
            scalars.append(f"{key}={value}")
    return ", ".join(scalars), lines


def command_line(argv: list[str]) -> str:
    return "python -m chaos " + " ".join(shlex.quote(arg) for arg in argv)


__all__ = ["ChaosRun", "Options", "command_line"]
