"""The workers as the API shows them, and their heartbeats:

    GET    /v1/workers  [?state=idle&job=train-7b]  every worker (admins), or those of the
                                                    caller's team's jobs (viewers, members)
    POST   /v1/workers/{id}/drain | /undrain        stop (resume) new reservations (admins)
    DELETE /v1/workers/{id}                         revoke the worker and its credential (admins)
    GET    /v1/workers/me                           the calling worker (its own credential)
    POST   /v1/workers/heartbeat  {healthy, detail} the calling worker is alive (its credential)

A row says where the worker came from and what it reported: origin, state, job, provider,
region, registered and last updated, one line of capabilities (GPUs, driver, CPUs, memory,
runtime verdict), and its liveness (alive/lost, last seen, heartbeats, health, draining). Never a
token or a credential.

A heartbeat (gpuprov/api/heartbeats.py: most are answered by its lean path before this route) is
one row write in a batch's transaction (gpuprov/store/liveness.py), and for a reserved or busy
worker one read of its current work; the API talks to Temporal for it only when it changed what
the job acts on (the worker's health verdict, or the cloud's notice about its machine: a reclaim
must start the replacement at once, not at the next sweep). It answers how long to wait for the
next one (`[workers] heartbeat_interval_seconds`), the node's lease (`[workers] lease_seconds`:
a node that hears no answer for that long stops its work), whether the worker is draining, and
its current work's id and whether that work is to stop, so a stop reaches the node within one
interval. Each heartbeat records until when the node may still run work if it hears nothing more
(`work_ends_by`: now, the lease, the stop grace period); a new attempt's work waits for it. A
revoked worker's heartbeat is refused (401) by its credential, with nothing written.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError

from gpuprov.api.auth import (
    BODY_REFUSALS,
    REFUSALS,
    ROLE_REFUSALS,
    Caller,
    Guard,
    require_admin,
    require_viewer,
    require_worker,
    worker_credential,
)
from gpuprov.api.heartbeats import HeartbeatRequest, HeartbeatResponse, Heartbeats
from gpuprov.api.scope import check_job, worker_visible
from gpuprov.config import JobsSettings, WorkersSettings
from gpuprov.models import (
    WorkerCapabilities,
    WorkerList,
    WorkerSummary,
    capabilities_text,
)
from gpuprov.store.db import WORKER_STATES, WorkerRecord
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records

_STATES = "^(" + "|".join(WORKER_STATES) + ")$"


WorkerId = Annotated[str, Path(min_length=1, max_length=64)]


def summary(worker: WorkerRecord) -> WorkerSummary:
    try:
        capabilities = WorkerCapabilities.model_validate(worker.capabilities)
    except ValidationError:  # a row written by another version: say so, do not fail the list
        capabilities = WorkerCapabilities(gpu_runtime_error="capabilities unreadable")
    shape = capabilities.shape(worker.provider, worker.region)
    return WorkerSummary(
        id=worker.id,
        origin=worker.origin,
        state=worker.state,
        job=worker.job,
        provider=worker.provider,
        region=worker.region,
        label=worker.label,
        vm=worker.vm,
        registered_at=worker.registered_at,
        updated_at=worker.updated_at,
        gpu=shape.gpu_name,
        gpu_count=shape.gpu_count,
        gpu_runtime_ok=shape.gpu_runtime_ok,
        capabilities=capabilities_text(capabilities),
        liveness=worker.liveness,
        last_seen_at=worker.last_seen_at,
        heartbeats=worker.heartbeats,
        health=worker.health,
        health_detail=worker.health_detail,
        draining=worker.draining,
    )


def _records(request: Request) -> Records:
    return request.app.state.records


def _liveness(request: Request) -> Liveness:
    return request.app.state.liveness


def _found(worker: WorkerRecord | None, worker_id: str) -> WorkerSummary:
    if worker is None:
        raise HTTPException(404, f"no worker {worker_id} that is not revoked")
    return summary(worker)


NOT_FOUND = {404: {"description": "no such worker, or it is revoked"}}


def add_routes(app: FastAPI, settings: WorkersSettings, jobs: JobsSettings) -> None:
    """The workers endpoints, on the app itself (its routes stay one flat list to inspect)."""
    # The node keeps its work for at most its lease and then the stop grace period.
    holds_work_for = timedelta(seconds=settings.lease + jobs.stop_grace_seconds)

    heartbeats = Heartbeats(
        app.state.liveness,
        app.state.waker,
        interval_seconds=settings.heartbeat_interval_seconds,
        lease_seconds=settings.lease,
        holds_work_for=holds_work_for,
    )
    app.state.heartbeats = heartbeats  # HeartbeatPath answers most heartbeats before the route

    # Every node sends one of these every interval: the route takes no more than it needs (no
    # dependency that reads the database; the credential is checked in the batch's write).
    @app.post(
        "/v1/workers/heartbeat",
        responses={**REFUSALS, **BODY_REFUSALS},
        response_model=HeartbeatResponse,
    )
    async def heartbeat(
        body: HeartbeatRequest,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(worker_credential)],
        request: Request,
    ) -> Response:
        if bearer is None:
            raise Guard(request).refused(
                None, "a worker credential is required (Authorization: Bearer gpw_...)"
            )
        answer = await heartbeats.record(bearer.credentials, body)
        if answer is None:  # unknown or revoked: nothing was written
            raise Guard(request).refused(bearer.credentials, "unknown or revoked worker credential")
        return Response(answer.model_dump_json(), media_type="application/json")

    for action, draining in (("drain", True), ("undrain", False)):
        _add_drain(app, action, draining)

    @app.delete(
        "/v1/workers/{worker_id}",
        dependencies=[Depends(require_admin)],
        responses={**ROLE_REFUSALS, **NOT_FOUND},
    )
    async def remove_worker(
        worker_id: WorkerId, liveness: Annotated[Liveness, Depends(_liveness)]
    ) -> WorkerSummary:
        return _found(await asyncio.to_thread(liveness.remove, worker_id), worker_id)

    @app.get("/v1/workers/me", responses=REFUSALS)
    async def own_worker(
        worker: Annotated[WorkerRecord, Depends(require_worker)],
    ) -> WorkerSummary:
        return summary(worker)

    @app.get("/v1/workers", responses=ROLE_REFUSALS)
    async def list_workers(
        request: Request,
        caller: Annotated[Caller, Depends(require_viewer)],
        records: Annotated[Records, Depends(_records)],
        state: Annotated[str | None, Query(pattern=_STATES)] = None,
        job: Annotated[str | None, Query(max_length=128)] = None,
    ) -> WorkerList:
        """Every worker (an admin), or those of the caller's team's jobs."""
        if job is not None and not caller.admin:
            await check_job(request, caller, job)
        rows = await asyncio.to_thread(records.workers, state=state, job=job)
        visible = [row for row in rows if await worker_visible(request, caller, row)]
        return WorkerList(workers=[summary(row) for row in visible])


def _add_drain(app: FastAPI, action: str, draining: bool) -> None:
    async def set_draining(
        worker_id: WorkerId, liveness: Annotated[Liveness, Depends(_liveness)]
    ) -> WorkerSummary:
        row = await asyncio.to_thread(liveness.set_draining, worker_id, draining)
        return _found(row, worker_id)

    app.post(
        f"/v1/workers/{{worker_id}}/{action}",
        dependencies=[Depends(require_admin)],
        responses={**ROLE_REFUSALS, **NOT_FOUND},
        name=f"{action}_worker",
    )(set_draining)
