"""The bench's client, in its own process: `python -m bench.driver` (a JSON request on stdin,
the JSON result on stdout).

It submits every job at once and releases each as soon as it is ready, the way a service using
`gpuprov.sdk.client` would, from outside the worker's process. In the worker's process it would take
the worker's CPU and its interpreter lock (about a tenth of a job's worker time at 200 jobs),
which is not gpuprov's cost. Clock readings are `time.time()` on the same machine as the server.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from pydantic import BaseModel, Field

from gpuprov import contract
from gpuprov.models import JobSpec
from gpuprov.sdk.client import GpuprovClient

# How often the driver looks for ready jobs to release (one list call for all of them).
DETECT_INTERVAL = 0.2


class DriverRequest(BaseModel):
    address: str
    namespace: str
    task_queue: str
    names: list[str]
    detect_interval: float = DETECT_INTERVAL


class DriverResult(BaseModel):
    submitted: dict[str, float] = Field(default_factory=dict)
    released: dict[str, float] = Field(default_factory=dict)
    cpu_seconds: float = 0.0  # this process, start-up included


def bench_job(name: str, nodes: int = 1) -> JobSpec:
    """The single-node job every scenario submits (8x H100, generous timeouts)."""
    return JobSpec.model_validate(
        {
            "name": name,
            "nodes": nodes,
            "resources": {"gpu": "H100", "gpus_per_node": 8},
            "provisioning_timeout_seconds": 3600,
        }
    )


async def drive(request: DriverRequest) -> DriverResult:
    client = await GpuprovClient.connect(
        request.address, request.namespace, task_queue=request.task_queue
    )
    result = DriverResult()

    async def submit(name: str) -> None:
        result.submitted[name] = time.time()
        await client.submit(bench_job(name))

    await asyncio.gather(*(submit(name) for name in request.names))
    await _release_when_ready(client, request, result)
    result.cpu_seconds = time.process_time()
    return result


async def _release_when_ready(
    client: GpuprovClient, request: DriverRequest, result: DriverResult
) -> None:
    """One visibility query per interval finds ready jobs for the whole batch (per-job status
    queries would load the worker being measured: queries run on the worker)."""
    temporal = client.temporal
    queue = f"TaskQueue = '{request.task_queue}'"
    ready_query = f"{queue} AND {contract.STATE.name} = 'ready' AND ExecutionStatus = 'Running'"
    closed_query = f"{queue} AND ExecutionStatus != 'Running'"
    names = set(request.names)

    async def release(name: str) -> None:
        result.released[name] = time.time()
        await client.job(name).release()

    while True:
        fresh = []
        async for execution in temporal.list_workflows(ready_query):
            name = execution.id.removeprefix("job-")
            if name in names and name not in result.released:
                fresh.append(name)
        await asyncio.gather(*(release(name) for name in fresh))
        closed = await temporal.count_workflows(closed_query)
        if closed.count >= len(names):
            return
        await asyncio.sleep(request.detect_interval)


def main() -> None:
    request = DriverRequest.model_validate_json(sys.stdin.read())
    result = asyncio.run(drive(request))
    sys.stdout.write(result.model_dump_json())
    sys.stdout.flush()
    # Leave without the interpreter's shutdown: the Temporal runtime's threads are still up,
    # and tearing them down at exit can abort the process (PyGILState_Release) after the
    # result is already written.
    os._exit(0)


if __name__ == "__main__":
    main()
