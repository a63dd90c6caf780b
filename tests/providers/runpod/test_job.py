"""A whole ProvisionJob on the real Temporal dev server against RunPodCloud over respx: the
cheapest offer answers RunPod's real stockout 400, the job fails over to the next offer, the
pod boots to RUNNING with ssh.direct; the core logs in over SSH with the key create put in
PUBLIC_KEY (the host key pinned at first use) and starts the node agent with a fresh token on
its stdin, the agent registers through the real API, the job is ready, is released, and the pod
is deleted. The same failover follows createPod's documented 400 and 403 ("Try your next
candidate", "Skip this candidate, keep going")."""

from __future__ import annotations

import pytest

from gpuprov.models import AttemptOutcome, JobState
from providers.errors import ErrorKind
from providers.ssh_common import AGENT_FILE, REMOTE_ROOT
from tests.helpers import job, ready_then_release
from tests.nodes import agent_stack, ssh_gpu_node
from tests.providers.runpod import samples
from tests.providers.runpod.fake_api import FakeRunPod
from tests.providers.runpod.openapi import validate_request
from tests.providers.ssh.test_job import bootstrap_result

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

CHEAPEST = "runpod/US-KS-2/secure/8x-NVIDIA-H100-PCIe"
NEXT = "runpod/EU-RO-1/secure/8x-NVIDIA-H100-80GB-HBM3"


async def test_stockout_on_the_cheapest_offer_fails_over_to_ready_then_deletes_the_pod(
    client, task_queue, job_name, tmp_path
):
    api = FakeRunPod(stockouts={("NVIDIA H100 PCIe", "US-KS-2")})
    cloud = api.cloud(poll_interval=0.05, boot_timeout=30, delete_timeout=30)
    try:
        async with (
            agent_stack(client, task_queue, {"runpod": cloud}, tmp_path, {"runpod"}) as stack,
            ssh_gpu_node(tmp_path, stack.keys) as pod_ssh,
        ):
            api.ssh_direct = (pod_ssh.host, pod_ssh.port)
            handle = await stack.gpuprov.submit(job(job_name))
            at_ready, final = await ready_then_release(handle)
            booted = await bootstrap_result(client, job_name)
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY, at_ready.error
    first, second = at_ready.attempts
    assert (first.offer.id, first.kind, first.step) == (CHEAPEST, ErrorKind.CAPACITY, "create")
    assert samples.STOCKOUT in (first.message or "")
    assert (second.offer.id, second.outcome) == (NEXT, AttemptOutcome.SUCCEEDED)
    stocked_out, node = at_ready.nodes  # one node per attempt
    assert (stocked_out.attempt, stocked_out.instance_ids) == (1, [])
    assert node.provider == "runpod" and node.region == "EU-RO-1"
    assert node.instance_ids == ["rp00000001"]
    assert node.ssh is not None and (node.ssh.host, node.ssh.port, node.ssh.user) == (
        pod_ssh.host,
        pod_ssh.port,
        "root",
    )
    # RunPod reports no host key: the first one seen is pinned, then the agent is started.
    assert booted["host_key_trust"] == "first-use"
    assert booted["host_key_fingerprint"] == pod_ssh.host_fingerprint
    assert node.worker_id is not None and node.worker_id == booted["worker_id"]
    assert (pod_ssh.home / REMOTE_ROOT / node.vm / AGENT_FILE).exists()
    assert at_ready.hourly_cost is not None and round(at_ready.hourly_cost.amount, 2) == 21.52

    assert final.state is JobState.COMPLETED
    assert api.calls("POST", "/v2/pods") == 2  # the stockout, then the one pod
    assert [body["name"] for body in api.created] == [f"gpuprov-{node.vm}"]
    assert stack.keys.client_public_key() in api.created[0]["env"]["PUBLIC_KEY"]
    assert api.deleted == ["rp00000001"]
    assert api.live_pods() == []  # nothing left running
    for request, _ in api.exchanges:
        validate_request(request)


@pytest.mark.parametrize(
    "refusal", [samples.BAD_REQUEST_400, samples.FORBIDDEN_403], ids=["400", "403"]
)
async def test_a_documented_400_or_403_on_the_cheapest_offer_fails_over_instead_of_aborting(
    client, task_queue, job_name, tmp_path, refusal
):
    api = FakeRunPod(refusals={("NVIDIA H100 PCIe", "US-KS-2"): refusal})
    cloud = api.cloud(poll_interval=0.05, boot_timeout=30, delete_timeout=30)
    try:
        async with (
            agent_stack(client, task_queue, {"runpod": cloud}, tmp_path, {"runpod"}) as stack,
            ssh_gpu_node(tmp_path, stack.keys) as pod_ssh,
        ):
            api.ssh_direct = (pod_ssh.host, pod_ssh.port)
            handle = await stack.gpuprov.submit(job(job_name))
            at_ready, final = await ready_then_release(handle)
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY, at_ready.error
    refused, served = at_ready.attempts
    assert (refused.offer.id, refused.kind, refused.step) == (
        CHEAPEST,
        ErrorKind.UNAVAILABLE,
        "create",
    )
    assert (served.offer.id, served.outcome) == (NEXT, AttemptOutcome.SUCCEEDED)
    assert final.state is JobState.COMPLETED
    assert api.live_pods() == []
