"""Teardown of one node, as jobs and the reconciler run it: never marked done early.

One activity, `retire`, deletes whatever carries the node's identity, waits until observe shows
nothing left, marks the row terminated (its worker revoked) and removes the side resources. A
teardown that fails for good (after the policy's rounds) is recorded as a possible orphan for
the reconciler: a node whose machine may still exist is `leaked`, one whose cleanup failed
after it was gone is terminated with its side resources still to clean.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.cloud import CloudActivities, VmInput
    from activities.errors import StepFailure
    from activities.store import OrphanInput, StoreActivities
    from gpuprov import contract
    from gpuprov.models import NodeInstance
    from providers.base import Capabilities
    from workflows.steps import in_rounds, run_step


async def retire(node: NodeInstance, hints: Capabilities) -> None:
    try:
        await in_rounds(lambda: _retire_once(node, hints))
    except StepFailure as failure:
        if failure.step == "cleanup":
            node.status = _gone_status(node)
            await record_orphan(node, f"cleanup: {failure}")
        else:
            node.status = "leaked"
            await record_orphan(node, str(failure))
        raise
    node.status = _gone_status(node)


def _gone_status(node: NodeInstance) -> str:
    """A node confirmed gone is terminated; if nothing was ever found under its identity, the
    create made nothing (it failed before any id) and it is not_created."""
    return "terminated" if node.instance_ids else "not_created"


async def _retire_once(node: NodeInstance, hints: Capabilities) -> None:
    node.instance_ids = await run_step(
        CloudActivities.retire,
        VmInput(location=node.location, vm=node.vm, ids=node.instance_ids),
        hints=hints,
        summary=f"tear down {node.vm}",
    )


async def record_orphan(node: NodeInstance, error: str) -> None:
    # Only the reconciler's tries count toward its backoff: a job's record, repeated when its
    # local activity runs again, must not push the next pass's try back by minutes.
    retried = workflow.info().workflow_type == contract.RECONCILE
    request = OrphanInput(node=node, error=error, retried=retried)
    await run_step(StoreActivities.record_orphan, request)
