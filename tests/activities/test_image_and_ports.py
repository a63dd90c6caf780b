"""A job's `image` and `ports`: the plan activity refuses a cloud that declares them
unsupported (the reason in `gpuprov offers` and in the job's status), the spec's values reach
create, and existing workers are not reserved for a job that names an image. Real dev server,
real database, the fake cloud configured per test."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from activities.store import ReserveInput, StoreActivities
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState, WorkerCapabilities
from gpuprov.sdk.client import OffersQuery
from providers.base import ResourceRequest
from tests.helpers import assert_nothing_left, fake_worker, fast_cloud, job, until

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

H100X8 = ResourceRequest(gpu="H100", gpus_per_node=8)


async def test_offers_of_a_cloud_that_cannot_open_ports_are_refused_with_the_reason(
    client, task_queue
):
    config = fast_cloud(unsupported=["ports"])
    async with fake_worker(client, task_queue, config) as (gpuprov, cloud):
        asked = await gpuprov.offers(OffersQuery(request=H100X8.model_copy(update={"ports": [80]})))
        plain = await gpuprov.offers(OffersQuery(request=H100X8))
        with_image = await gpuprov.offers(
            OffersQuery(request=H100X8.model_copy(update={"image": "nvcr.io/nvidia/pytorch:24.05"}))
        )
        plan_calls = cloud.state.call_counts().get(("plan", "*"), 0)
    assert asked.offers == [] and asked.errors == []
    assert asked.rejected == ["fake/*: fake cannot open ports"]
    assert len(plain.offers) == 3 and plain.rejected == []
    assert len(with_image.offers) == 3  # it can run an image: only ports are refused
    assert plan_calls == 2  # a refused cloud's plan is never asked


async def test_a_job_asking_what_no_cloud_can_do_fails_with_the_reason_in_its_status(
    client, task_queue, job_name
):
    config = fast_cloud(unsupported=["image", "ports"])
    async with fake_worker(client, task_queue, config) as (gpuprov, cloud):
        handle = await gpuprov.submit(
            job(
                job_name,
                image="registry.example/train:1",
                ports=[8080],
                provisioning_timeout_seconds=30,
            )
        )
        final = await handle.result()
        assert cloud.state.creates_per_vm() == {}
    assert final.state is JobState.FAILED
    assert final.attempts == []
    assert final.rejected_offers == [
        "fake/*: fake cannot run a container image; fake cannot open ports"
    ]


async def test_the_jobs_image_and_ports_reach_create_and_the_port_rule_goes_at_release(
    client, task_queue, job_name
):
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, cloud):
        spec = job(job_name, nodes=2, image="registry.example/train:1", ports=[8080, 6006])
        handle = await gpuprov.submit(spec)
        ready = await until(handle, lambda s: s.state is JobState.READY)
        assert ready.state is JobState.READY, ready.message
        rows = cloud.live_instances()
        assert [(row.image, row.ports) for row in rows] == [
            ("registry.example/train:1", (8080, 6006))
        ] * 2
        rules = sorted(kind for _, _, kind, _ in cloud.state.live_side_resources())
        assert rules == ["firewall", "firewall", "ports", "ports"]
        await handle.release()
        final = await handle.result()
        assert final.state is JobState.COMPLETED
        assert_nothing_left(cloud)


async def test_a_job_without_image_or_ports_makes_no_port_rule(client, task_queue, job_name):
    async with fake_worker(client, task_queue, fast_cloud()) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        ready = await until(handle, lambda s: s.state is JobState.READY)
        (row,) = cloud.live_instances()
        assert (row.image, row.ports) == (None, ())
        assert [kind for _, _, kind, _ in cloud.state.live_side_resources()] == ["firewall"]
        await handle.release()
        await handle.result()
    assert ready.state is JobState.READY


async def test_an_existing_worker_is_not_reserved_for_a_job_naming_an_image(tmp_path: Path):
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    capabilities = WorkerCapabilities.model_validate(
        {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 8, "gpu_runtime_ok": True}
    ).model_dump(mode="json")
    with records.db.session() as session:
        records.register_worker(
            session,
            origin="existing",
            provider=None,
            region=None,
            label="lab-box",
            vm=None,
            job=None,
            capabilities=capabilities,
            state="idle",
        )
        session.commit()
    store = StoreActivities(records, timedelta(minutes=5))
    try:
        imaged = H100X8.model_copy(update={"image": "registry.example/train:1"})
        assert (
            await store.reserve_existing_workers(ReserveInput(job="a", request=imaged, nodes=1))
            == []
        )
        # ports alone do not stop it: a machine you own has no cloud firewall to open
        ported = H100X8.model_copy(update={"ports": [8080]})
        (reserved,) = await store.reserve_existing_workers(
            ReserveInput(job="b", request=ported, nodes=1)
        )
        assert reserved.label == "lab-box"
    finally:
        records.db.dispose()
