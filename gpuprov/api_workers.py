"""The workers as the API shows them:

    GET /v1/workers     [?state=idle&job=train-7b]  every worker (operators: an API key)
    GET /v1/workers/me                              the calling worker (its own credential)

A row says where the worker came from and what it reported: origin, state, job, provider,
region, registered and last updated, and one line of capabilities (GPUs, driver, CPUs, memory,
runtime verdict). Never a token or a credential.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated

from fastapi import Depends, FastAPI, Query, Request
from pydantic import ValidationError

from gpuprov.auth import REFUSALS, require_operator, require_worker
from gpuprov.db import WORKER_STATES, WorkerRecord
from gpuprov.models import WorkerCapabilities
from gpuprov.records import Records
from gpuprov.render import capabilities_text
from providers.base import Model

_STATES = "^(" + "|".join(WORKER_STATES) + ")$"


class WorkerSummary(Model):
    id: str
    origin: str  # managed / existing
    state: str  # idle / reserved / busy / revoked
    job: str | None
    provider: str | None
    region: str | None
    label: str | None
    vm: str | None
    registered_at: datetime
    updated_at: datetime  # the last change of state or job
    gpu: str | None  # the most common GPU model, if any
    gpu_count: int
    gpu_runtime_ok: bool | None  # None: no GPU and no verdict
    capabilities: str  # one line: GPUs, driver/CUDA, CPUs, memory, disk, runtime verdict


class WorkerList(Model):
    workers: list[WorkerSummary]


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
    )


def _records(request: Request) -> Records:
    return request.app.state.records


def add_routes(app: FastAPI) -> None:
    """The workers endpoints, on the app itself (its routes stay one flat list to inspect)."""

    @app.get("/v1/workers/me", responses=REFUSALS)
    async def own_worker(
        worker: Annotated[WorkerRecord, Depends(require_worker)],
    ) -> WorkerSummary:
        return summary(worker)

    @app.get("/v1/workers", dependencies=[Depends(require_operator)], responses=REFUSALS)
    async def list_workers(
        records: Annotated[Records, Depends(_records)],
        state: Annotated[str | None, Query(pattern=_STATES)] = None,
        job: Annotated[str | None, Query(max_length=128)] = None,
    ) -> WorkerList:
        rows = await asyncio.to_thread(records.workers, state=state, job=job)
        return WorkerList(workers=[summary(row) for row in rows])
