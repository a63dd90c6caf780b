"""Teardown of one node: delete, confirm gone, then record it. Never marked done early.

Jobs started on this code (`versions.lean()`) run it as one activity, `retire`; older histories
and the reconciler use the separate steps (`terminate`, then `cleanup`).

A node is `terminated` only after observe-by-identity shows nothing left; a teardown that gives
up (terminate, or the cleanup of side resources) is recorded as a possible orphan in the
database for the reconciler; a node whose terminate gave up is `leaked` in the job status.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.cloud import CloudActivities, VmInput
    from activities.errors import StepFailure
    from activities.store import OrphanInput, StoreActivities, VmStatusInput
    from gpuprov.models import NodeInstance
    from providers.base import Capabilities
    from workflows import policy, versions
    from workflows.steps import (
        CLOUD_STEP,
        SHORT_STEP,
        heartbeat_timeout,
        in_rounds,
        run_step,
        wait_timeout,
    )


async def terminate(node: NodeInstance, hints: Capabilities) -> None:
    try:
        await in_rounds(lambda: _delete_and_confirm(node, hints))
    except StepFailure as failure:
        node.status = "leaked"
        await _record_orphan(node, str(failure))
        raise
    node.status = _gone_status(node)
    await run_step(
        "mark_vm",
        StoreActivities.mark_vm,
        VmStatusInput(vm=node.vm, status="terminated"),
        start_to_close_timeout=SHORT_STEP,
        retry_policy=policy.TEARDOWN_RETRY,
    )


async def _delete_and_confirm(node: NodeInstance, hints: Capabilities) -> None:
    location = node.location
    node.instance_ids = await run_step(
        "delete",
        CloudActivities.delete,
        VmInput(location=location, vm=node.vm, ids=node.instance_ids),
        retry_policy=policy.TEARDOWN_RETRY,
        summary=f"delete {node.vm}",
    )
    await run_step(
        "wait_gone",
        CloudActivities.wait_gone,
        VmInput(location=location, vm=node.vm, ids=node.instance_ids),
        start_to_close_timeout=wait_timeout(hints.delete_timeout),
        heartbeat_timeout=heartbeat_timeout(hints),
        retry_policy=policy.TEARDOWN_RETRY,
        summary=f"wait for {node.vm} to be gone",
    )


async def retire(node: NodeInstance, hints: Capabilities) -> None:
    """The whole teardown of one node as one activity (`versions.lean()`): delete, confirm gone,
    mark terminated, clean up the side resources. A failure before gone leaves the node
    `leaked`; a failed cleanup leaves it terminated. Either is recorded as a possible orphan for
    the reconciler, as `terminate` and `cleanup` do."""
    try:
        await in_rounds(lambda: _retire_once(node, hints))
    except StepFailure as failure:
        if failure.step == "cleanup":
            node.status = _gone_status(node)
            await _record_orphan(node, f"cleanup: {failure}")
        else:
            node.status = "leaked"
            await _record_orphan(node, str(failure))
        raise
    node.status = _gone_status(node)


def _gone_status(node: NodeInstance) -> str:
    """A node confirmed gone is terminated; if nothing was ever found under its identity, the
    create made nothing (it failed before any id) and it is not_created."""
    return "terminated" if node.instance_ids else "not_created"


async def _retire_once(node: NodeInstance, hints: Capabilities) -> None:
    node.instance_ids = await run_step(
        "retire",
        CloudActivities.retire,
        VmInput(location=node.location, vm=node.vm, ids=node.instance_ids),
        start_to_close_timeout=wait_timeout(hints.delete_timeout) + 2 * CLOUD_STEP,
        heartbeat_timeout=heartbeat_timeout(hints),
        retry_policy=policy.TEARDOWN_RETRY,
        summary=f"tear down {node.vm}",
    )


async def cleanup(node: NodeInstance) -> None:
    """Remove the node's side resources (firewall, keys); a cleanup that gives up is recorded as
    a possible orphan too, so the reconciler cleans up again (chaos finding 1)."""
    try:
        await in_rounds(
            lambda: run_step(
                "cleanup",
                CloudActivities.cleanup,
                VmInput(location=node.location, vm=node.vm),
                retry_policy=policy.TEARDOWN_RETRY,
                summary=f"cleanup {node.vm}",
            )
        )
    except StepFailure as failure:
        if versions.current():
            await _record_orphan(node, f"cleanup: {failure}")
        raise


async def _record_orphan(node: NodeInstance, error: str) -> None:
    await run_step(
        "record_orphan",
        StoreActivities.record_orphan,
        OrphanInput(node=node, error=error),
        start_to_close_timeout=SHORT_STEP,
        retry_policy=policy.TEARDOWN_RETRY,
    )
