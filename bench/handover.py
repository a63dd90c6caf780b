"""Work hand-over: how soon a job's work starts on every node once its last node is ready, and
what the waiting nodes ask the API meanwhile.

One N-node job (64 in the full bench) on the fake cloud, whose booted machines run the simulated
node agent: it registers through the real API with its join token, heartbeats, and waits for its
work the way gpuprov.node's agent does (a long poll on GET /v1/work, gpuprov/api/work_waits.py).
The worker and the API (uvicorn, on loopback) run in this process, on SQLite. Measured from the
rows the job wrote, per node: from the last node's registration to its work's start
(`work.started_at`), p50, p99 and the slowest; and the GET /v1/work requests the API answered
from the first registration until the work was written, per second.

Run twice back to back on one machine: with long polls, and as before them (the agent's read
answered at once, then asked again after a pause that doubles from 0.5 s to 5 s), the baseline.

Nothing here asserts; tests/test_bench.py runs the smallest size.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import select
from starlette.types import Receive, Scope, Send
from temporalio.client import Client

from bench.billed_idle import NodeIdle, calls_of, worked_idle
from bench.cloud import TimedCloud
from bench.scenarios import fake_cloud
from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import FakeProviderConfig, JobsSettings, WorkersSettings
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.models import JobSpec, JobState, Resources
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.db import WorkerRecord, WorkRecord
from providers.fake import agent as fake_agent

HEARTBEAT = 5.0  # seconds between one node's heartbeats: they wake nothing here
GPUS_PER_NODE = 8


def _percentile(values: list[float], p: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, -(-len(ordered) * p // 100) - 1)]


@dataclass
class HandoverRun:
    nodes: int
    long_poll: bool
    job: str = ""  # its name (the workflow is job-<name>)
    # Seconds, one per node, from the last node's registration to its work's start ...
    handover: list[float] = field(default_factory=list)
    # ... of which the job took this long to write the work (the same for every node) ...
    job_wrote_after: float | None = None
    # ... and this long each node to hear of it and start it.
    node_started_after: list[float] = field(default_factory=list)
    idle: list[NodeIdle] = field(default_factory=list)  # billed idle per node (billed_idle.py)
    gpus_per_node: int = GPUS_PER_NODE
    waiting_seconds: float = 0.0  # first registration to the work written
    work_reads: int = 0  # GET /v1/work answered meanwhile
    state: str | None = None
    error: str | None = None

    @property
    def p50(self) -> float | None:
        return _percentile(self.handover, 50)

    @property
    def p99(self) -> float | None:
        return _percentile(self.handover, 99)

    @property
    def slowest(self) -> float | None:
        return max(self.handover, default=None)

    @property
    def read_rate(self) -> float | None:
        """GET /v1/work per second while the nodes waited."""
        return self.work_reads / self.waiting_seconds if self.waiting_seconds > 0 else None


class WorkReads:
    """ASGI middleware: when each GET /v1/work arrived (the API's own `state` shown through, so
    its long polls end at shutdown)."""

    def __init__(self, app: object) -> None:
        self.app = app
        self.state = app.state  # type: ignore[attr-defined]
        self.at: list[float] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/v1/work":
            self.at.append(time.time())
        await self.app(scope, receive, send)  # type: ignore[operator]


@contextlib.contextmanager
def _without_long_polls(off: bool) -> Iterator[None]:
    """The simulated agent as it was before long polls: its read of the work never held."""
    kept = fake_agent.LONG_POLL
    if off:
        fake_agent.LONG_POLL = 0.0
    try:
        yield
    finally:
        fake_agent.LONG_POLL = kept


async def handover(client: Client, nodes: int, long_poll: bool, timeout: float) -> HandoverRun:
    run = HandoverRun(nodes=nodes, long_poll=long_poll)
    run.job = spec_name = f"handover-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="gpuprov-bench-handover-") as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        config = fake_cloud(simulate_agent=True, boot_delay_seconds=0.2, poll_interval=0.2)
        cloud = TimedCloud(config, trace=True)
        task_queue = f"bench-handover-{uuid.uuid4().hex[:8]}"
        workers = WorkersSettings(heartbeat_interval_seconds=HEARTBEAT, lost_after_seconds=120)
        app = WorkReads(
            create_app(records, workers=workers, temporal=client, task_queue=task_queue)
        )
        worker = build_worker(
            client, task_queue, {"fake": cloud}, records, api_url=url, jobs=JobsSettings(),
            sandboxed=False, max_concurrent_activities=4 * nodes + 50,
        )  # fmt: skip
        spec = JobSpec(
            name=spec_name,
            nodes=nodes,
            resources=Resources(gpu="H100", gpus_per_node=GPUS_PER_NODE),
            provisioning_timeout_seconds=int(timeout),
            run="true",
        )
        try:
            with _without_long_polls(not long_poll):
                async with serving(app, "127.0.0.1", port), worker:  # type: ignore[arg-type]
                    handle = await GpuprovClient(client, task_queue).submit(spec)
                    final = await asyncio.wait_for(handle.result(), timeout)
                    run.state = final.state.value
                    if final.state is not JobState.COMPLETED:
                        run.error = final.error or f"the job ended {final.state.value}"
            _measure(run, records, spec.name, app.at)
            _idle(run, records, spec.name, cloud, config)
        except (TimeoutError, RuntimeError) as error:
            run.error = run.error or f"{type(error).__name__}: {error}"
        finally:
            await cloud.aclose()
            records.db.dispose()
    return run


def _measure(run: HandoverRun, records: object, job: str, reads: list[float]) -> None:
    with records.db.session() as session:  # type: ignore[attr-defined]
        registered = session.exec(
            select(WorkerRecord.registered_at).where(WorkerRecord.job == job)
        ).all()
        work = session.exec(select(WorkRecord).where(WorkRecord.job == job)).all()
    if not registered or not work:
        run.error = run.error or "no registration or no work recorded"
        return
    last_ready = max(registered)
    written = min(row.created_at for row in work)
    run.handover = [(row.started_at - last_ready).total_seconds() for row in work if row.started_at]
    run.job_wrote_after = (written - last_ready).total_seconds()
    run.node_started_after = [
        (row.started_at - row.created_at).total_seconds() for row in work if row.started_at
    ]
    first = min(registered)
    run.waiting_seconds = (written - first).total_seconds()
    run.work_reads = sum(1 for at in reads if _stamp(first) <= at < _stamp(written))


def _idle(
    run: HandoverRun, records: object, job: str, cloud: TimedCloud, config: FakeProviderConfig
) -> None:
    """Each node's billed idle: registration, placement, hand-over, and down from its work's
    end (bench/billed_idle.py)."""
    with records.db.session() as session:  # type: ignore[attr-defined]
        workers = session.exec(select(WorkerRecord).where(WorkerRecord.job == job)).all()
        work = session.exec(select(WorkRecord).where(WorkRecord.job == job)).all()
    registered = {row.id: row.registered_at for row in workers}
    by_vm = calls_of(cloud.calls)
    for row in work:
        calls = by_vm.get(row.vm or "")
        if calls is None or row.started_at is None or row.worker_id not in registered:
            continue
        run.idle.append(
            worked_idle(
                calls,
                registered=_stamp(registered[row.worker_id]),
                written=_stamp(row.created_at),
                started=_stamp(row.started_at),
                ended=_stamp(row.ended_at) if row.ended_at else None,
                boot_delay=config.boot_delay_seconds,
                delete_delay=config.delete_delay_seconds,
                vm=row.vm or "",
            )
        )


def _stamp(moment: datetime) -> float:
    return moment.timestamp()
