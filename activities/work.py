"""The job's side of its work, as local bookkeeping activities: assign an epoch's work to the
nodes, ask it to stop, give it up, and read how it stands (gpuprov/store/work.py); each of the job's
own run only."""

from __future__ import annotations

import asyncio

from pydantic import Field
from temporalio import activity

from gpuprov.models import NodeWork
from gpuprov.store.work import Assignment, WorkRecords
from providers.base import Model


class AssignInput(Model):
    job: str
    epoch: int = Field(ge=0)
    assignments: list[Assignment] = Field(min_length=1)
    run: str | None = None  # the job's run (gpuprov/store/runs.py); None: sent before runs were


class EpochInput(Model):
    job: str
    epoch: int = Field(ge=0)
    run: str | None = None  # the job's run (gpuprov/store/runs.py); None: sent before runs were


class WorkActivities:
    def __init__(self, work: WorkRecords) -> None:
        self._work = work

    def all(self) -> list[object]:
        return [self.assign_work, self.stop_work, self.abandon_work, self.work_state]

    @activity.defn(name="assign_work")
    async def assign_work(self, request: AssignInput) -> None:
        await asyncio.to_thread(
            self._work.assign, request.job, request.epoch, request.assignments, request.run
        )

    @activity.defn(name="stop_work")
    async def stop_work(self, request: EpochInput) -> int:
        return await asyncio.to_thread(
            self._work.request_stop, request.job, request.epoch, request.run
        )

    @activity.defn(name="abandon_work")
    async def abandon_work(self, request: EpochInput) -> int:
        return await asyncio.to_thread(self._work.abandon, request.job, request.epoch, request.run)

    @activity.defn(name="work_state")
    async def work_state(self, request: EpochInput) -> list[NodeWork]:
        return await asyncio.to_thread(self._work.of_job, request.job, request.epoch, request.run)
