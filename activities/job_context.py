"""job_context: what a job reads before it provisions, as one local activity.

A job begins with this one step instead of four in a row: its admission by its team
(activities/teams.py: refused, nothing else happens), the providers' capabilities, the shared
blocks, and idle compatible existing workers reserved for every node (or none). The reads come
first and the reservation, the only write besides the run's row, last, so a retry after a
failed read never reserves twice. A job that plans again later (after waiting for a block to
lapse) reads capabilities and blocks again with the separate steps (`describe_providers`,
`active_blocks`).
"""

from __future__ import annotations

import asyncio

from pydantic import Field
from temporalio import activity

from activities.cloud import CloudActivities
from activities.store import ReserveInput, StoreActivities
from activities.teams import Admission, AdmitInput, TeamActivities
from gpuprov.models import Block, ExistingWorker
from providers.base import Capabilities, Model


class ContextInput(Model):
    reserve: ReserveInput | None = None  # None: provision, never take existing workers (k3s)
    job: str | None = None  # with `run`: the job's run, recorded first (gpuprov/store/runs.py)
    run: str | None = None
    admit: AdmitInput | None = None  # None: a run from before teams


class JobContext(Model):
    capabilities: dict[str, Capabilities] = Field(default_factory=dict)
    blocks: list[Block] = Field(default_factory=list)
    reserved: list[ExistingWorker] = Field(default_factory=list)
    admission: Admission | None = None  # None: not asked (a run from before teams)


class JobContextActivities:
    def __init__(
        self, cloud: CloudActivities, store: StoreActivities, teams: TeamActivities
    ) -> None:
        self._cloud = cloud
        self._store = store
        self._teams = teams

    def all(self) -> list[object]:
        return [self.job_context]

    @activity.defn(name="job_context")
    async def job_context(self, request: ContextInput) -> JobContext:
        admission = None
        if request.admit is not None:
            admission = await asyncio.to_thread(self._teams.admit, request.admit)
            if admission.refused is not None:
                return JobContext(admission=admission)
        capabilities = await self._cloud.describe_providers()
        blocks = await self._store.active_blocks()
        if request.job is not None:
            await self._store.note_run(request.job, request.run)
        reserved = []
        if request.reserve is not None:
            reserved = await self._store.reserve_existing_workers(request.reserve)
        return JobContext(
            capabilities=capabilities, blocks=blocks, reserved=reserved, admission=admission
        )
