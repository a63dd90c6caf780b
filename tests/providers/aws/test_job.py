"""A whole ProvisionJob on the real Temporal dev server against the AWS adapter over moto: the
cheapest offer's zone answers EC2's real stockout (HTTP 500 InsufficientInstanceCapacity), the
job fails over to the next zone, reaches ready, is released, and nothing is left running."""

from __future__ import annotations

from gpuprov.models import AttemptOutcome, JobState
from providers.errors import ErrorKind
from tests.helpers import job, ready_then_release
from tests.providers.aws.stack import (
    aws_cloud,
    error_reply,
    gpuprov_key_pairs,
    gpuprov_security_groups,
    live_instances,
    worker_with,
)

STOCKED_OUT = "aws/us-east-1a/p5.48xlarge"
NEXT = "aws/us-east-1b/p5.48xlarge"


async def test_a_stockout_in_one_zone_fails_over_to_the_next_and_leaves_nothing_behind(
    client, task_queue, job_name, front
):
    front.answer(
        "RunInstances",
        error_reply(500, "insufficient_instance_capacity.xml"),
        **{"Placement.AvailabilityZone": "us-east-1a"},
    )
    cloud = aws_cloud(front.url)
    try:
        async with worker_with(client, task_queue, {"aws": cloud}) as gpuprov:
            handle = await gpuprov.submit(job(job_name, max_hourly_cost=100.0))
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
    assert final.state is JobState.COMPLETED

    runs = front.requests("RunInstances")
    assert [r.params["Placement.AvailabilityZone"] for r in runs] == ["us-east-1a", "us-east-1b"]
    assert runs[0].params["ClientToken"] != runs[1].params["ClientToken"]
    assert live_instances(front.upstream) == []  # terminated, confirmed by observe-by-tag
    assert gpuprov_security_groups(front.upstream) == []  # both attempts cleaned up
    assert gpuprov_key_pairs(front.upstream) == []
