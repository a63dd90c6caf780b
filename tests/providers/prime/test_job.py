"""A whole ProvisionJob on the real Temporal dev server against the Prime adapter over respx: the
cheapest offer answers Prime's stockout on create, the job fails over to the next offer, which
runs (ACTIVE, installation FINISHED, an SSH endpoint); the core logs in over SSH with the key
prepare registered (the host key pinned at first use) and starts the node agent with a fresh
token on its stdin, the agent registers through the real API, the job is ready, is released,
and the pod is deleted. A job asking for ports is never offered Prime, and says why."""

from __future__ import annotations

import pytest

from gpuprov.models import AttemptOutcome, JobState
from providers.errors import ErrorKind
from providers.prime.cloud import PrimeCloud
from providers.prime.config import PrimeConfig
from providers.ssh_common import AGENT_FILE, REMOTE_ROOT
from tests.helpers import job, ready_then_release
from tests.nodes import agent_stack, ssh_gpu_node
from tests.providers.prime import bodies
from tests.providers.prime.fake_api import API_KEY, FakePrime
from tests.providers.refusals import assert_refused, refused
from tests.providers.ssh.test_job import bootstrap_result

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

CHEAPEST = "prime/hyperstack/CANADA-1/n3-H100x1/1xH100_80GB"
NEXT = "prime/runpod/US-KS-2/NVIDIA_H100_PCIe/1xH100_80GB"


async def test_stockout_on_the_cheapest_offer_fails_over_and_the_pod_is_deleted(
    client, task_queue, job_name, tmp_path
):
    prime = FakePrime([bodies.HYPERSTACK_H100, bodies.RUNPOD_H100, bodies.DC_ROAN_H100X8])
    prime.create_errors["n3-H100x1"] = (400, bodies.STOCKOUT)
    config = PrimeConfig(poll_interval=0.05, boot_timeout=20, delete_timeout=20)
    cloud = PrimeCloud(config, api_key=API_KEY, transport=prime.transport())
    try:
        async with (
            agent_stack(client, task_queue, {"prime": cloud}, tmp_path, {"prime"}) as stack,
            ssh_gpu_node(tmp_path, stack.keys) as pod_ssh,
        ):
            prime.ssh = (pod_ssh.host, pod_ssh.port)
            handle = await stack.gpuprov.submit(
                job(job_name, resources={"gpu": "H100", "gpus_per_node": 1})
            )
            at_ready, final = await ready_then_release(handle)
            booted = await bootstrap_result(client, job_name)
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY
    stockout, success = at_ready.attempts
    assert (stockout.offer.id, stockout.kind, stockout.step) == (
        CHEAPEST,
        ErrorKind.CAPACITY,
        "create",
    )
    assert "out of stock" in (stockout.message or "")
    assert (success.offer.id, success.outcome) == (NEXT, AttemptOutcome.SUCCEEDED)
    [node] = [n for n in at_ready.nodes if n.attempt == 2]
    assert node.status == "running" and node.ssh is not None
    assert (node.ssh.host, node.ssh.port, node.ssh.user) == (pod_ssh.host, pod_ssh.port, "root")
    # Prime reports no host key: the first one seen is pinned, then the agent is started.
    assert booted["host_key_trust"] == "first-use"
    assert booted["host_key_fingerprint"] == pod_ssh.host_fingerprint
    assert node.worker_id is not None and node.worker_id == booted["worker_id"]
    assert (pod_ssh.home / REMOTE_ROOT / node.vm / AGENT_FILE).exists()
    assert [key["publicKey"] for key in prime.keys.values()] == [stack.keys.client_public_key()]

    assert final.state is JobState.COMPLETED
    assert [body["pod"]["cloudId"] for body in prime.created] == ["n3-H100x1", "NVIDIA H100 PCIe"]
    assert all(body["pod"]["name"].startswith(f"gpuprov-{job_name}-a") for body in prime.created)
    assert len(node.instance_ids) == 1 and prime.deleted == node.instance_ids
    assert prime.live_pods() == []
    assert prime.violations == []


async def test_a_job_asking_for_ports_never_gets_a_prime_offer_and_says_why(
    client, task_queue, job_name
):
    prime = FakePrime([bodies.HYPERSTACK_H100, bodies.RUNPOD_H100])
    cloud = PrimeCloud(PrimeConfig(), api_key=API_KEY, transport=prime.transport())
    spec = job(
        job_name,
        resources={"gpu": "H100", "gpus_per_node": 1},
        ports=[8888],
        provisioning_timeout_seconds=30,
    )
    try:
        refusal = await refused(client, task_queue, cloud, spec)
    finally:
        await cloud.aclose()
    assert_refused(refusal, "prime", "prime cannot open ports")
    assert prime.calls == [] and prime.created == []  # not even asked for offers
