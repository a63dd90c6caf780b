"""A whole ProvisionJob on the real Temporal dev server against the AWS adapter over moto: the
cheapest offer's zone answers EC2's real stockout (HTTP 500 InsufficientInstanceCapacity), the
job fails over to the next zone, the launched machine's user data (read back from EC2) boots
the node agent, which registers through the real API, the job is ready, is released, and
nothing is left running."""

from __future__ import annotations

import base64

import pytest

from gpuprov.models import AttemptOutcome, JobState
from providers.errors import ErrorKind
from tests.helpers import job, ready_then_release
from tests.nodes import agent_stack, booting_nodes
from tests.providers.aws.stack import (
    aws_cloud,
    ec2,
    error_reply,
    gpuprov_key_pairs,
    gpuprov_security_groups,
    live_instances,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

STOCKED_OUT = "aws/us-east-1a/p5.48xlarge"
NEXT = "aws/us-east-1b/p5.48xlarge"


def launched_user_data(moto_url: str) -> dict[str, bytes]:
    """The user data of every live instance, as EC2 keeps it (DescribeInstanceAttribute)."""
    client = ec2(moto_url)
    return {
        instance["InstanceId"]: base64.b64decode(
            client.describe_instance_attribute(
                InstanceId=instance["InstanceId"], Attribute="userData"
            )["UserData"]["Value"]
        )
        for instance in live_instances(moto_url)
    }


async def test_a_stockout_in_one_zone_fails_over_to_the_next_and_leaves_nothing_behind(
    client, task_queue, job_name, front, tmp_path
):
    front.answer(
        "RunInstances",
        error_reply(500, "insufficient_instance_capacity.xml"),
        **{"Placement.AvailabilityZone": "us-east-1a"},
    )
    cloud = aws_cloud(front.url)
    try:
        async with (
            agent_stack(client, task_queue, {"aws": cloud}, tmp_path) as stack,
            booting_nodes(lambda: launched_user_data(front.upstream), tmp_path) as agents,
        ):
            handle = await stack.gpuprov.submit(job(job_name, max_hourly_cost=100.0))
            at_ready, final = await ready_then_release(handle, timeout=60)
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY, at_ready
    first, second = at_ready.attempts
    assert (first.offer.id, first.kind, first.step) == (STOCKED_OUT, ErrorKind.CAPACITY, "create")
    assert "InsufficientInstanceCapacity" in (first.message or "")
    assert second.offer.id == NEXT and second.outcome is AttemptOutcome.SUCCEEDED
    stocked_out, ready = at_ready.nodes
    assert (stocked_out.attempt, stocked_out.instance_ids) == (1, [])  # nothing was launched
    assert (ready.attempt, ready.zone, ready.status) == (2, "us-east-1b", "running")
    assert ready.instance_ids[0].startswith("i-")
    assert ready.ssh is not None and ready.ssh.user == "ubuntu"
    [agent] = agents  # one machine booted, its agent registered: the node the job placed
    assert agent.returncode == 0, agent.stderr
    assert ready.worker_id is not None and ready.worker_id in agent.stdout
    assert final.state is JobState.COMPLETED

    runs = front.requests("RunInstances")
    assert [r.params["Placement.AvailabilityZone"] for r in runs] == ["us-east-1a", "us-east-1b"]
    assert runs[0].params["ClientToken"] != runs[1].params["ClientToken"]
    assert live_instances(front.upstream) == []  # terminated, confirmed by observe-by-tag
    assert gpuprov_security_groups(front.upstream) == []  # both attempts cleaned up
    assert gpuprov_key_pairs(front.upstream) == []
