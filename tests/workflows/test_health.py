"""Health: `gpuprov health JOB|VM` and the ready job's periodic check, on the real dev
server and the fake cloud. The SSH probe against a real sshd is in
tests/providers/ssh/test_job.py."""

from __future__ import annotations

import pytest
from temporalio.client import Client

from gpuprov.models import JobState
from providers.base import Location, Verdict
from tests.helpers import eventually, fake_worker, fast_cloud, job, until

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


async def test_health_of_a_ready_job_then_of_its_machine_once_gone(
    client: Client, task_queue: str, job_name: str
) -> None:
    async with fake_worker(client, task_queue, fast_cloud()) as (gp, _):
        handle = await gp.submit(job(job_name, nodes=2, health_check_interval_seconds=None))
        ready = await until(handle, lambda s: s.state is JobState.READY)
        reports = await gp.health(job_name)
        assert [r.vm for r in reports] == [node.vm for node in ready.live_nodes()]
        assert {r.verdict for r in reports} == {Verdict.HEALTHY}
        # This worker has no SSH keys: the probe says it was skipped, it does not hide it.
        assert all(any(f.code == "ssh_not_probed" for f in r.findings) for r in reports)

        await handle.release()
        final = await handle.result()
        [gone] = await gp.health(final.nodes[0].vm)
        assert gone.verdict is Verdict.GONE

        [unknown] = await gp.health("no-such-vm-a1-n0-000000")
        assert unknown.verdict is Verdict.GONE
        assert unknown.findings[0].code == "unknown_vm"


async def test_a_ready_job_checks_health_and_reports_a_machine_that_vanished(
    client: Client, task_queue: str, job_name: str
) -> None:
    async with fake_worker(client, task_queue, fast_cloud()) as (gp, cloud):
        handle = await gp.submit(job(job_name, health_check_interval_seconds=1))
        ready = await until(handle, lambda s: s.state is JobState.READY)
        first = await until(handle, lambda s: bool(s.health))
        assert first.health[0].verdict is Verdict.HEALTHY

        [node] = ready.live_nodes()
        location = Location(provider=node.provider, region=node.region, zone=node.zone)
        await cloud.delete(location, node.vm, node.instance_ids)  # e.g. preempted under us
        await eventually(lambda: cloud.live_instances() == [], "the machine gone from the cloud")
        vanished = await until(
            handle, lambda s: bool(s.health) and s.health[0].verdict is Verdict.GONE, timeout=60
        )
        assert vanished.state is JobState.READY
        # What the Temporal UI shows as the workflow's current details.
        metadata = await client.get_workflow_handle(f"job-{job_name}").query(
            "__temporal_workflow_metadata"
        )
        assert f"node {node.vm}: **gone**" in metadata.current_details
        await handle.release()
        final = await handle.result()
        assert final.state is JobState.COMPLETED
