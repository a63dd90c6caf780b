"""A whole ProvisionJob on the real Temporal dev server against the Vast adapter over respx:
the cheapest listing is taken before we get it (no_such_ask), the job fails over to the next,
which runs with a direct SSH port; the core logs in over SSH (the key onstart installed, the
host key pinned at first use), starts the node agent with a fresh token on its stdin, the agent
registers through the real API, the job is ready, is released, and the instance is destroyed."""

from __future__ import annotations

import pytest
import respx

from gpuprov.models import AttemptOutcome, JobState
from providers.base import SshEndpoint
from providers.errors import ErrorKind
from providers.ssh_common import AGENT_FILE, REMOTE_ROOT
from providers.vast.cloud import VastCloud
from tests.helpers import job, ready_then_release
from tests.nodes import agent_stack, ssh_gpu_node
from tests.providers.ssh.test_job import bootstrap_result
from tests.providers.vast import fixtures
from tests.providers.vast.conftest import vast_config

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@pytest.fixture(autouse=True)
def local_api(router: respx.Router) -> None:
    """The worker's own calls to the API on loopback are not Vast's: let them through."""
    router.route(host="127.0.0.1").pass_through()


async def test_a_taken_listing_fails_over_to_the_next_which_boots_is_released_and_destroyed(
    client, task_queue, job_name, vast_api, tmp_path
):
    vast_api.listings = [
        fixtures.h100_listing(101, 18.0),  # cheapest: gone by the time we ask
        fixtures.h100_listing(102, 19.5),
        fixtures.h100_listing(103, 25.0, geolocation="Quebec, CA"),
    ]
    vast_api.gone_asks.add(101)
    vast_api.boot_polls = 2
    cloud = VastCloud(vast_config(), api_key=fixtures.API_KEY)
    try:
        async with (
            agent_stack(client, task_queue, {"vast": cloud}, tmp_path, {"vast"}) as stack,
            ssh_gpu_node(tmp_path, stack.keys) as node_ssh,
        ):
            vast_api.ssh = (node_ssh.host, node_ssh.port)
            spec = job(job_name, placement={"providers": ["vast"]})
            at_ready, final = await ready_then_release(await stack.gpuprov.submit(spec))
            booted = await bootstrap_result(client, job_name)
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY, at_ready.error
    first, second = at_ready.attempts
    assert (first.offer.id, first.kind, first.step) == ("vast/101", ErrorKind.CAPACITY, "create")
    assert "no_such_ask" in (first.message or "")
    assert second.offer.id == "vast/102" and second.outcome is AttemptOutcome.SUCCEEDED
    assert any(b.key == "vast/101" and b.kind is ErrorKind.CAPACITY for b in at_ready.blocks)

    node = next(n for n in at_ready.nodes if n.attempt == second.number)
    assert node.instance_ids == ["4000"]
    assert node.ssh == SshEndpoint(host=node_ssh.host, port=node_ssh.port, user="root")
    assert at_ready.hourly_cost is not None and at_ready.hourly_cost.amount == 19.5
    # Vast reports no host key: the first one seen is pinned, then the agent is started.
    assert booted["host_key_trust"] == "first-use"
    assert booted["host_key_fingerprint"] == node_ssh.host_fingerprint
    assert node.worker_id is not None and node.worker_id == booted["worker_id"]
    assert (node_ssh.home / REMOTE_ROOT / node.vm / AGENT_FILE).exists()
    assert stack.keys.client_public_key() in vast_api.created[0][1]["onstart"]

    assert final.state is JobState.COMPLETED, final.error
    assert [ask for ask, _ in vast_api.created] == [102]  # one instance, no duplicate
    assert vast_api.created[0][1]["label"] == f"gpuprov-{node.vm}"
    assert vast_api.destroyed == [4000]
    assert vast_api.live_instances() == []


async def test_a_two_node_job_rents_two_listings_skipping_the_taken_one(
    client, task_queue, job_name, vast_api, tmp_path
):
    vast_api.listings = [fixtures.h100_listing(ask, price) for ask, price in SHAPES]
    vast_api.gone_asks.add(201)
    vast_api.boot_polls = 1
    cloud = VastCloud(vast_config(), api_key=fixtures.API_KEY)
    try:
        async with (
            agent_stack(client, task_queue, {"vast": cloud}, tmp_path, {"vast"}) as stack,
            ssh_gpu_node(tmp_path, stack.keys) as node_ssh,
        ):
            vast_api.ssh = (node_ssh.host, node_ssh.port)  # both nodes: one SSH server
            spec = job(job_name, nodes=2, placement={"providers": ["vast"]})
            at_ready, final = await ready_then_release(await stack.gpuprov.submit(spec))
    finally:
        await cloud.aclose()

    assert at_ready.state is JobState.READY, at_ready.error
    tried = [(a.offer.id, a.kind) for a in at_ready.attempts]
    # 201 has no second listing under its price; 202's second node hits the taken 201; 203's
    # nodes rent 203 and 202 (201 is skipped).
    assert tried == [
        ("vast/201", ErrorKind.UNAVAILABLE),
        ("vast/202", ErrorKind.CAPACITY),
        ("vast/203", None),
    ]
    assert sorted(ask for ask, _ in vast_api.created) == [202, 202, 203]
    placed = at_ready.live_nodes()
    assert len(placed) == 2 and all(n.worker_id for n in placed)  # each node's agent registered
    assert final.state is JobState.COMPLETED, final.error
    assert vast_api.live_instances() == []


SHAPES = [(201, 18.0), (202, 18.5), (203, 19.0)]
