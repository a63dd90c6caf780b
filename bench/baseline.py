"""The limit: the same provider calls a single-node gpuprov job makes, driven by a plain asyncio
loop with no Temporal, no database and no failover.

Per job: plan -> prepare (cheapest offer) -> create -> observe every poll_interval until
Running (ready) -> delete -> observe every poll_interval until gone -> cleanup (gone). Release
is immediate. N jobs run at once with asyncio.gather against one FakeCloud configured like the
gpuprov run's, in the same process, so the ratio gpuprov / baseline cancels the machine's speed.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from bench.cloud import CallRecord, TimedCloud
from bench.harness import JobTiming
from gpuprov.config import FakeProviderConfig
from providers.base import InstanceSpec, InstanceStatus, ResourceRequest
from providers.fake import FakeCloud

REQUEST = ResourceRequest(gpu="H100", gpus_per_node=8)


async def run_baseline(
    config: FakeProviderConfig, count: int
) -> tuple[list[JobTiming], dict[tuple[str, str], int], list[CallRecord]]:
    """`count` baseline jobs at once: their timings, the cloud's call counts and its trace."""
    cloud = TimedCloud(config, trace=True)
    run = uuid.uuid4().hex[:6]
    try:
        timings = await asyncio.gather(
            *(_one_job(cloud, f"base-{run}-{index}") for index in range(count))
        )
        return list(timings), cloud.state.call_counts(), cloud.calls
    finally:
        await cloud.aclose()


async def _one_job(cloud: FakeCloud, name: str) -> JobTiming:
    poll = cloud.config.poll_interval
    timing = JobTiming(name=name, submitted=time.time())
    offer = (await cloud.plan(REQUEST))[0]
    spec = InstanceSpec(vm=f"{name}-n0", job=name, node_index=0, attempt=1)
    prepared = await cloud.prepare(offer, spec)
    ids = await cloud.create(offer, prepared, spec)
    location = offer.location
    while True:
        observed = await cloud.observe(location, spec.vm)
        if observed and all(o.status is InstanceStatus.RUNNING for o in observed):
            break
        await asyncio.sleep(poll)
    timing.ready = timing.released = time.time()
    await cloud.delete(location, spec.vm, ids)
    while await cloud.observe(location, spec.vm):
        await asyncio.sleep(poll)
    await cloud.cleanup(location, spec.vm)
    timing.completed = time.time()
    return timing
