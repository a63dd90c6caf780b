"""A whole ProvisionJob on the real Temporal dev server against the Lambda adapter over respx:
the cheapest offer's launch answers Lambda's real insufficient-capacity error, the job fails
over to the same type in another region, the launched machine's `user_data` boots the node
agent, which registers through the real API, the job is ready, is released, and the instance
is terminated (confirmed by observe) with nothing left behind."""

from __future__ import annotations

import pytest

from gpuprov.models import AttemptOutcome, JobState
from providers.errors import ErrorKind
from tests.helpers import job, ready_then_release
from tests.nodes import agent_stack, booting_nodes

from . import fixtures as fx
from .fake_lambda import FakeLambda

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

EAST = "lambda/us-east-3/gpu_8x_h100_sxm5"  # cheapest (23.92, ties broken by id): stocked out
SOUTH = "lambda/us-south-2/gpu_8x_h100_sxm5"  # same type and price in another region


def launched_user_data(account: FakeLambda) -> dict[str, str]:
    """The launch body's `user_data` of every instance the account holds, by instance name."""
    names = {instance["name"] for instance in account.live()}
    return {body["name"]: body["user_data"] for body in account.launches if body["name"] in names}


async def test_stockout_on_the_cheapest_offer_fails_over_to_another_region_and_cleans_up(
    client, task_queue, job_name, tmp_path
):
    account = FakeLambda(boot_lists=2)
    account.launch_answers[("us-east-3", "gpu_8x_h100_sxm5")] = (400, fx.INSUFFICIENT_CAPACITY)
    cloud = account.cloud(ssh_key_name="ops-team", poll_interval=0.05, delete_timeout=30)
    try:
        async with (
            agent_stack(client, task_queue, {"lambda": cloud}, tmp_path) as stack,
            booting_nodes(lambda: launched_user_data(account), tmp_path) as agents,
        ):
            handle = await stack.gpuprov.submit(job(job_name))
            at_ready, final = await ready_then_release(handle)
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY, at_ready.error
    first, second = at_ready.attempts
    assert (first.offer.id, first.kind, first.step) == (EAST, ErrorKind.CAPACITY, "create")
    assert "instance-operations/launch/insufficient-capacity" in (first.message or "")
    assert (second.offer.id, second.outcome) == (SOUTH, AttemptOutcome.SUCCEEDED)
    (node,) = [n for n in at_ready.nodes if n.attempt == 2]
    (instance_id,) = node.instance_ids
    assert node.ssh is not None and (node.ssh.user, node.ssh.port) == ("ubuntu", 22)
    [agent] = agents  # one machine booted, its agent registered: the node the job placed
    assert agent.returncode == 0, agent.stderr
    assert node.worker_id is not None and node.worker_id in agent.stdout

    assert final.state is JobState.COMPLETED, final.error
    launched = [(body["region_name"], body["name"]) for body in account.launches]
    assert launched == [
        ("us-east-3", f"gpuprov-{first_vm(at_ready)}"),
        ("us-south-2", f"gpuprov-{node.vm}"),
    ]  # one launch per offer: the stockout was not retried, the success not duplicated
    assert account.terminated == [instance_id]
    assert account.instances == {}  # terminated, and no longer even listed
    assert [key["name"] for key in account.keys.values()] == ["ops-team"]


def first_vm(status) -> str:
    return next(n.vm for n in status.nodes if n.attempt == 1)
