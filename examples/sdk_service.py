"""Another service using the gpuprov SDK: ask for GPU machines, use them, give them back.

Start the embedded stack in one shell, then run this in another:

    .venv/bin/gpuprov dev                      # Temporal dev server + worker + fake cloud
    .venv/bin/python examples/sdk_service.py   # --address / --task-queue for another cluster

The job is built in code (a `JobSpec`, the same model a YAML job file becomes), and every answer
is a typed model: `JobStatus`, `NodeInstance`, `JobSummary`. Errors are `GpuprovError`s that say
what went wrong (a job that failed carries the offers it tried and the clouds' own words).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from gpuprov.models import Resources
from gpuprov.sdk.client import GpuprovClient, GpuprovError, JobSpec, JobState, JobStatus


def training_job(name: str) -> JobSpec:
    """One node with eight H100s, at most 40 USD/hour, terminated when released."""
    return JobSpec(
        name=name,
        nodes=1,
        resources=Resources(gpu="H100", gpus_per_node=8),
        max_hourly_cost=40.0,
        provisioning_timeout_seconds=600,
    )


def show_progress(status: JobStatus) -> None:
    print(f"  {status.state.value}: {status.waiting_for or ''}".rstrip())


async def run_on_gpus(status: JobStatus) -> None:
    """Where the service's real work goes: here it only says where it would run."""
    for node in status.live_nodes():
        ssh = f"{node.ssh.user}@{node.ssh.host}:{node.ssh.port}" if node.ssh else "no ssh yet"
        print(f"node {node.node_index}: {node.vm} on {node.provider}/{node.region} ({ssh})")


async def main(
    address: str = "localhost:7233",
    task_queue: str = "gpuprov",
    namespace: str = "default",
    name: str | None = None,
    timeout: float = 900,
) -> JobStatus:
    """Submit one job, wait until it is ready, use it, release it; the final status."""
    client = await GpuprovClient.connect(address, namespace, task_queue)
    spec = training_job(name or f"sdk-example-{uuid.uuid4().hex[:8]}")
    handle = await client.submit(spec)
    print(f"submitted {spec.name} (workflow {spec.workflow_id})")
    try:
        ready = await handle.wait_ready(timeout, on_change=show_progress)
    except TimeoutError:
        await handle.cancel()  # do not leave a job provisioning that nobody waits for
        raise
    cost = ready.hourly_cost
    print(f"ready: {cost.amount:.2f} {cost.currency}/{cost.unit}" if cost else "ready")
    try:
        await run_on_gpus(ready)
    finally:
        await handle.release()
    final = await handle.result()
    print(f"{final.name}: {final.state.value}")
    for node in final.nodes:
        print(f"  {node.vm}: {node.status}")
    return final


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="localhost:7233")
    parser.add_argument("--task-queue", default="gpuprov")
    parser.add_argument("--namespace", default="default")
    args = parser.parse_args()
    try:
        final = asyncio.run(main(args.address, args.task_queue, args.namespace))
    except (GpuprovError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0 if final.state is JobState.COMPLETED else 1


if __name__ == "__main__":
    code = cli()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalization, as `gpuprov` does: the Temporal client's Rust threads can
    # crash it after a clean run (temporalio/sdk-python#300).
    os._exit(code)
