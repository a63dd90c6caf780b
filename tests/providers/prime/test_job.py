"""A whole ProvisionJob on the real Temporal dev server against the Prime adapter over respx: the
cheapest offer answers Prime's stockout on create, the job fails over to the next offer, reaches
ready (ACTIVE, installation FINISHED, an SSH endpoint), is released, and the pod is deleted."""

from __future__ import annotations

import tempfile

from gpuprov.client import GpuprovClient
from gpuprov.engine import build_worker, open_records
from gpuprov.models import AttemptOutcome, JobState
from providers.errors import ErrorKind
from providers.prime.cloud import PrimeCloud
from providers.prime.config import PrimeConfig
from tests.helpers import job, ready_then_release
from tests.providers.prime import bodies
from tests.providers.prime.fake_api import API_KEY, FakePrime

CHEAPEST = "prime/hyperstack/CANADA-1/n3-H100x1/1xH100_80GB"
NEXT = "prime/runpod/US-KS-2/NVIDIA_H100_PCIe/1xH100_80GB"


async def test_stockout_on_the_cheapest_offer_fails_over_and_the_pod_is_deleted(
    client, task_queue, job_name
):
    prime = FakePrime([bodies.HYPERSTACK_H100, bodies.RUNPOD_H100, bodies.DC_ROAN_H100X8])
    prime.create_errors["n3-H100x1"] = (400, bodies.STOCKOUT)
    config = PrimeConfig(poll_interval=0.05, boot_timeout=20, delete_timeout=20)
    cloud = PrimeCloud(config, api_key=API_KEY, transport=prime.transport())
    with tempfile.TemporaryDirectory(prefix="gpuprov-prime-") as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        worker = build_worker(
            client, task_queue, {"prime": cloud}, records, api_url="http://127.0.0.1:9"
        )
        try:
            async with worker:
                handle = await GpuprovClient(client, task_queue).submit(
                    job(job_name, resources={"gpu": "H100", "gpus_per_node": 1})
                )
                at_ready, final = await ready_then_release(handle)
        finally:
            await cloud.aclose()
            records.db.dispose()

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
    assert (node.ssh.host, node.ssh.port, node.ssh.user) == ("203.0.113.1", 22, "root")

    assert final.state is JobState.COMPLETED
    assert [body["pod"]["cloudId"] for body in prime.created] == ["n3-H100x1", "NVIDIA H100 PCIe"]
    assert all(body["pod"]["name"].startswith(f"gpuprov-{job_name}-a") for body in prime.created)
    assert prime.deleted == node.instance_ids == ["pod-0001"]
    assert prime.live_pods() == []
    assert prime.violations == []
