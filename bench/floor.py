"""The Temporal floor: what a job of gpuprov's shape costs on this machine when it does no work.

`FloorJob` is registered as "ProvisionJob" on its own task queue, so bench/driver.py submits and
releases it exactly like a real job. It has the happy path's server-visible skeleton and nothing
else: three activities to ready (plan, launch, wait running), one upsert (`GpuprovState=ready`),
the `release` signal, one activity to gone (retire), and a workflow result. Its activities
return at once; no database, no cloud, no local activities, no timers. The throughput of this
skeleton on the same dev server and worker settings is the most any workflow-per-job design on
Temporal can reach here; gpuprov's distance from it is gpuprov's own cost.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from gpuprov import contract

STEP = timedelta(seconds=30)


@activity.defn(name="floor_step")
async def floor_step(step: str) -> str:
    return step


@workflow.defn(name=contract.PROVISION_JOB)
class FloorJob:
    def __init__(self) -> None:
        self._released = False

    @workflow.signal(name=contract.JOB_RELEASE)
    def release(self) -> None:
        self._released = True

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> str:
        for step in ("plan", "launch", "wait_running"):
            await workflow.execute_activity(floor_step, step, start_to_close_timeout=STEP)
        workflow.upsert_search_attributes([contract.STATE.value_set("ready")])
        await workflow.wait_condition(lambda: self._released)
        await workflow.execute_activity(floor_step, "retire", start_to_close_timeout=STEP)
        return str(spec.get("name"))


def floor_worker(client: Client, task_queue: str, **options: Any) -> Worker:
    """A worker for FloorJob with the options gpuprov's bench worker gets (unsandboxed, as a
    deployed gpuprov worker runs)."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[FloorJob],
        activities=[floor_step],
        workflow_runner=UnsandboxedWorkflowRunner(),
        **options,
    )
