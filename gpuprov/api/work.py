"""A node's work and a job's output, over the API:

    GET  /v1/work[?wait=S]                        the calling worker's current assignment (204:
                                                  none): id, job, epoch, rank, command, state,
                                                  stop grace period; with `wait`, a long poll
                                                  held until there is one (work_waits.py)
    POST /v1/work/{id}/started                    it starts now; 409 when it must not (stopped
                                                  before it started, or given up)
    POST /v1/work/{id}/exit    {code, tail}       it ended with `code`; its last lines
    POST /v1/work/{id}/logs    {seq, stream, data} a chunk of its output, kept once per seq
    GET  /v1/jobs/{job}/logs   ?after=&node=&limit=&run= a job's output, its latest run's
                                                    unless `run` names another (viewers of
                                                    its team, admins)

The work's `env` holds `${{ secrets.NAME }}` references in the database; `GET /v1/work`
answers it with the values, and each value is `***` in every output chunk and exit tail a node
reports before it is stored (gpuprov/api/work_secrets.py).

The work endpoints take the worker's credential (gpuprov/api/auth.py) and only ever read or change
that worker's own rows: another worker's work is 404, and nothing changes. The rows and their
states are gpuprov/store/work.py's; the output and its per-job cap (`[jobs] log_cap_bytes`)
gpuprov/store/logs.py's.

An exit report that moves a row on stamps the worker changed (gpuprov/store/liveness.py), so the
liveness sweep wakes the job. Where the API was given a Temporal client it sends the job
`workers_changed` itself at once and records the job told; a signal that fails is only logged,
and the sweep is the safety net. The signal carries nothing: the job reads the rows. A start
wakes nobody: the job acts on ends and lost nodes only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from pydantic import Field
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from gpuprov.api.auth import (
    BODY_REFUSALS,
    REFUSALS,
    ROLE_REFUSALS,
    Caller,
    require_viewer,
    require_worker,
)
from gpuprov.api.scope import check_job
from gpuprov.api.work_secrets import WorkSecrets
from gpuprov.api.work_waits import MAX_WAIT, WorkWaits
from gpuprov.config import JobsSettings
from gpuprov.models import JOB_NAME_PATTERN, WorkState
from gpuprov.sdk.signals import tell_workers_changed
from gpuprov.store.db import WorkerRecord, WorkRecord
from gpuprov.store.liveness import Liveness
from gpuprov.store.logs import LogPage, LogRecords, clean_text
from gpuprov.store.runs import NO_SUCH_RUN, RUN_PATTERN, RunNotFound, pick_run
from gpuprov.store.work import RunCommand, WorkRecords
from providers.base import Model

log = logging.getLogger(__name__)

MAX_TAIL = 8192  # characters of an exit report's last lines
MAX_CHUNK = 60_000  # characters of one log chunk (the body is at most 64 KiB anyway)
MAX_SEQ = 2**62
# The largest `after`: a log chunk's id is an INTEGER column, 32 bits on PostgreSQL (no id is
# ever larger). Past it, a 422 naming the parameter, not a driver's overflow answered 500.
MAX_AFTER = 2**31 - 1
RECONNECT_PAUSE = 30.0  # seconds before a failed connection to Temporal is tried again
CONNECT_TIMEOUT = 10.0

# A Temporal client, or how to get one when it is first needed (`gpuprov api`), or none.
TemporalSource = Client | Callable[[], Awaitable[Client]] | None


class WorkAssignment(Model):
    """What a node runs: `setup` then `run` under /bin/sh, with `env` added."""

    id: str
    job: str
    epoch: int
    rank: int
    command: RunCommand
    state: WorkState
    stop_grace_seconds: float  # SIGTERM, this long, then SIGKILL


class WorkReport(Model):
    id: str
    state: WorkState
    changed: bool  # this report moved the row on (False: a repeat, or the work was over)


class ExitReport(Model):
    code: int = Field(ge=-255, le=255)  # negative: the signal that ended it
    tail: str | None = Field(default=None, max_length=MAX_TAIL)
    lease_lapsed: bool = False  # the node stopped it: cut off from the API past its lease


class LogChunkIn(Model):
    seq: int = Field(ge=0, le=MAX_SEQ)
    stream: Literal["stdout", "stderr"]
    data: str = Field(max_length=MAX_CHUNK)


class LogStored(Model):
    stored: bool  # False: this seq was stored before (a repeat)


WorkId = Annotated[str, Path(min_length=1, max_length=64)]
NOT_YOURS = {404: {"description": "no such work of this worker"}}


class JobWaker:
    """Tells a job at once that one of its nodes' work moved on."""

    def __init__(self, liveness: Liveness, temporal: TemporalSource) -> None:
        self._liveness = liveness
        self._source = temporal
        self._client = temporal if isinstance(temporal, Client) else None
        self._retry_at = 0.0

    async def changed(self, worker_id: str) -> None:
        """Stamp the worker changed and signal its job (where there is a client)."""
        stamped = await asyncio.to_thread(self._liveness.changed, worker_id)
        if stamped is not None:
            await self.tell(worker_id, *stamped)

    async def tell(self, worker_id: str, job: str, changed_at: datetime) -> None:
        """Signal the job of a worker stamped changed at `changed_at`, and record it told."""
        client = await self._connect()
        if client is None:
            return
        try:
            await tell_workers_changed(client, job)
        except RPCError as error:
            if error.status is not RPCStatusCode.NOT_FOUND:  # closed jobs need no telling
                log.warning("workers_changed to job %s failed (the sweep tells it): %s", job, error)
                return
        await asyncio.to_thread(self._liveness.notified, worker_id, changed_at)

    async def client(self) -> Client | None:
        """The Temporal client, connecting on first use; None without one (or while a failed
        connection waits out its pause)."""
        return await self._connect()

    async def _connect(self) -> Client | None:
        if self._client is not None or self._source is None or isinstance(self._source, Client):
            return self._client
        if time.monotonic() < self._retry_at:
            return None
        try:
            self._client = await asyncio.wait_for(self._source(), CONNECT_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - any failure: the sweep still tells the job
            self._retry_at = time.monotonic() + RECONNECT_PAUSE
            log.warning("no Temporal client for job wake-ups (the sweep tells them): %s", error)
        return self._client


def _work(request: Request) -> WorkRecords:
    return request.app.state.work


def _mine(work: WorkRecords, work_id: str, worker: WorkerRecord) -> WorkRecord:
    row = work.of_worker(work_id, worker.id)
    if row is None:
        raise HTTPException(404, f"no work {work_id} of this worker")
    return row


def assignment(row: WorkRecord, grace: float, command: RunCommand | None = None) -> WorkAssignment:
    return WorkAssignment(
        id=row.id,
        job=row.job,
        epoch=row.epoch,
        rank=row.node_rank,
        command=command or RunCommand.model_validate(row.command),
        state=WorkState(row.state),
        stop_grace_seconds=grace,
    )


def add_routes(app: FastAPI, jobs: JobsSettings) -> None:
    """The work and log endpoints, on the app itself (`app.state.waker` tells the jobs)."""
    database = app.state.records.db if app.state.records is not None else None
    app.state.work = WorkRecords(database) if database is not None else None
    logs = LogRecords(database) if database is not None else None
    waker: JobWaker = app.state.waker
    secrets: WorkSecrets = app.state.work_secrets
    waits = app.state.work_waits = WorkWaits(app.state.work) if app.state.work is not None else None

    @app.get(
        "/v1/work",
        response_model=WorkAssignment,
        responses={
            **REFUSALS,
            204: {"description": "no work now (or none came within `wait` seconds)"},
            429: {"description": "too many long polls held here now; see Retry-After"},
            503: {"description": "its secrets cannot be read now (no key for them)"},
        },
    )
    async def current_work(
        worker: Annotated[WorkerRecord, Depends(require_worker)],
        work: Annotated[WorkRecords, Depends(_work)],
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT)] = 0,
    ) -> Any:
        """The assignment; with `wait`, held up to that many seconds until there is one."""
        row = await asyncio.to_thread(work.for_worker, worker.id)
        if row is None and wait > 0:
            row = await waits.until_assigned(worker.id, wait)
        if row is None:
            return Response(status_code=204)
        # The only answer that holds secret values: the agent sets them in the work's env.
        return assignment(row, jobs.stop_grace_seconds, await secrets.resolved(row))

    @app.post(
        "/v1/work/{work_id}/started",
        responses={**REFUSALS, **NOT_YOURS, 409: {"description": "it must not start"}},
    )
    async def started(
        work_id: WorkId,
        worker: Annotated[WorkerRecord, Depends(require_worker)],
        work: Annotated[WorkRecords, Depends(_work)],
    ) -> WorkReport:
        before = await asyncio.to_thread(_mine, work, work_id, worker)
        if not await asyncio.to_thread(work.report_started, work_id, worker.id):
            raise HTTPException(409, f"work {work_id} must not start: it is {before.state}")
        # A start wakes nobody: the job decides on ends (and on lost nodes), so a large job's
        # history does not grow by one signal per node for it.
        changed = before.state == WorkState.ASSIGNED.value
        after = await asyncio.to_thread(_mine, work, work_id, worker)
        return WorkReport(id=work_id, state=WorkState(after.state), changed=changed)

    @app.post("/v1/work/{work_id}/exit", responses={**REFUSALS, **BODY_REFUSALS, **NOT_YOURS})
    async def exited(
        work_id: WorkId,
        body: ExitReport,
        worker: Annotated[WorkerRecord, Depends(require_worker)],
        work: Annotated[WorkRecords, Depends(_work)],
    ) -> WorkReport:
        row = await asyncio.to_thread(_mine, work, work_id, worker)
        tail = await secrets.hidden(row, clean_text(body.tail)) if body.tail else None
        changed = await asyncio.to_thread(
            work.report_exit, work_id, worker.id, body.code, tail, lease_lapsed=body.lease_lapsed
        )
        if changed:
            await waker.changed(worker.id)
        after = await asyncio.to_thread(_mine, work, work_id, worker)
        return WorkReport(id=work_id, state=WorkState(after.state), changed=changed)

    @app.post("/v1/work/{work_id}/logs", responses={**REFUSALS, **BODY_REFUSALS, **NOT_YOURS})
    async def output(
        work_id: WorkId,
        body: LogChunkIn,
        worker: Annotated[WorkerRecord, Depends(require_worker)],
        work: Annotated[WorkRecords, Depends(_work)],
    ) -> LogStored:
        row = await asyncio.to_thread(_mine, work, work_id, worker)
        assert logs is not None  # a worker was authenticated: there is a database
        data = await secrets.hidden(row, body.data)
        stored = await asyncio.to_thread(
            logs.append, row, body.seq, body.stream, data, jobs.log_cap_bytes
        )
        return LogStored(stored=stored)

    @app.get("/v1/jobs/{job}/logs", responses={**ROLE_REFUSALS, **NO_SUCH_RUN})
    async def job_output(
        request: Request,
        caller: Annotated[Caller, Depends(require_viewer)],
        job: Annotated[str, Path(pattern=JOB_NAME_PATTERN)],
        after: Annotated[int, Query(ge=0, le=MAX_AFTER)] = 0,
        node: Annotated[int | None, Query(ge=0, le=1024)] = None,
        limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
        run: Annotated[str | None, Query(pattern=RUN_PATTERN)] = None,
    ) -> LogPage:
        assert logs is not None  # an operator was authenticated: there is a database
        await check_job(request, caller, job, run)
        try:
            chosen = await asyncio.to_thread(pick_run, logs.db, job, run)
        except RunNotFound as unknown:
            raise HTTPException(404, str(unknown)) from None
        page = await asyncio.to_thread(logs.chunks, job, after, node, limit, chosen)
        return page.model_copy(update={"run": chosen})
