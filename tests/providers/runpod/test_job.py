"""A whole ProvisionJob on the real Temporal dev server against RunPodCloud over respx: the
cheapest offer answers RunPod's real stockout 400, the job fails over to the next offer, the
pod boots to RUNNING with ssh.direct, the job is ready, is released, and the pod is deleted.
The same failover follows createPod's documented 400 and 403 ("Try your next candidate",
"Skip this candidate, keep going")."""

from __future__ import annotations

import pytest

from gpuprov.client import GpuprovClient
from gpuprov.engine import build_worker, open_records
from gpuprov.models import AttemptOutcome, JobState
from providers.errors import ErrorKind
from tests.helpers import job, ready_then_release
from tests.providers.runpod import samples
from tests.providers.runpod.fake_api import FakeRunPod
from tests.providers.runpod.openapi import validate_request

CHEAPEST = "runpod/US-KS-2/secure/8x-NVIDIA-H100-PCIe"
NEXT = "runpod/EU-RO-1/secure/8x-NVIDIA-H100-80GB-HBM3"


async def test_stockout_on_the_cheapest_offer_fails_over_to_ready_then_deletes_the_pod(
    client, task_queue, job_name, tmp_path
):
    api = FakeRunPod(stockouts={("NVIDIA H100 PCIe", "US-KS-2")})
    cloud = api.cloud(poll_interval=0.05, boot_timeout=30, delete_timeout=30)
    records = open_records(f"sqlite:///{tmp_path}/gpuprov.db")
    worker = build_worker(
        client, task_queue, {"runpod": cloud}, records, api_url="http://127.0.0.1:9"
    )
    try:
        async with worker:
            handle = await GpuprovClient(client, task_queue).submit(job(job_name))
            at_ready, final = await ready_then_release(handle)
    finally:
        await cloud.aclose()
        records.db.dispose()

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
        "195.26.233.3",
        34446,
        "root",
    )
    assert at_ready.hourly_cost is not None and round(at_ready.hourly_cost.amount, 2) == 21.52

    assert final.state is JobState.COMPLETED
    assert api.calls("POST", "/v2/pods") == 2  # the stockout, then the one pod
    assert [body["name"] for body in api.created] == [f"gpuprov-{node.vm}"]
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
    records = open_records(f"sqlite:///{tmp_path}/gpuprov.db")
    worker = build_worker(
        client, task_queue, {"runpod": cloud}, records, api_url="http://127.0.0.1:9"
    )
    try:
        async with worker:
            handle = await GpuprovClient(client, task_queue).submit(job(job_name))
            at_ready, final = await ready_then_release(handle)
    finally:
        await cloud.aclose()
        records.db.dispose()

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
