"""Registration end to end: real API, real tokens, real database, real dev server.

The fake cloud's booted instances run a simulated agent that registers through the API with the
join token they were given; placement waits for the worker row that registration wrote and
checks the capabilities it holds. Nothing a node (or anyone else) sends reaches the workflow."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import select

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import FaultRule
from gpuprov.engine.worker import open_records
from gpuprov.models import AttemptOutcome, JobState, WorkerCapabilities
from gpuprov.sdk.client import JobNotFound, OffersQuery
from gpuprov.store.db import BlockRecord, CostRecord, JoinToken, VmRecord, WorkerRecord
from gpuprov.store.records import Records
from providers.base import ResourceRequest
from providers.errors import ErrorKind
from tests.helpers import (
    OFFER_A,
    OFFER_B,
    assert_nothing_left,
    decoded_history,
    fake_worker,
    fast_cloud,
    job,
    ready_then_release,
    until,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


@asynccontextmanager
async def control_plane(client, records: Records) -> AsyncIterator[str]:
    """The real API on a free loopback port (it needs no Temporal connection)."""
    port = free_port()
    async with serving(create_app(records), "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
async def api_url(client, sqlite_records: Records) -> AsyncIterator[str]:
    async with control_plane(client, sqlite_records) as url:
        yield url


def agent_cloud(*faults: FaultRule, **overrides):
    return fast_cloud(list(faults), simulate_agent=True, **overrides)


def rows(records: Records, table) -> list:
    with records.db.session() as session:
        return list(session.exec(select(table)).all())


async def test_nodes_register_with_their_tokens_before_the_job_is_ready(
    client, task_queue, job_name, records
):
    """On SQLite and on PostgreSQL (the `records` fixture runs both)."""
    sqlite_records = records
    async with (
        control_plane(client, records) as api_url,
        fake_worker(client, task_queue, agent_cloud(), records, api_url) as (gpuprov, cloud),
    ):
        handle = await gpuprov.submit(job(job_name, nodes=2))
        at_ready, final = await ready_then_release(handle)
        plaintexts = {row.join_token for row in cloud.state.instances()}
        assert_nothing_left(cloud)

    assert at_ready.state is JobState.READY
    for node in at_ready.nodes:
        assert node.worker_id is not None
        assert node.capabilities is not None and node.capabilities.gpu_runtime_ok
        assert len(node.capabilities.gpus) == 8
    workers = {w.id: w for w in rows(sqlite_records, WorkerRecord)}
    assert set(workers) == {n.worker_id for n in at_ready.nodes}
    for node in at_ready.nodes:
        worker = workers[node.worker_id]
        # identity from the VM record, never from the node
        assert (worker.origin, worker.provider, worker.region, worker.vm, worker.job) == (
            "managed",
            "fake",
            "r1",
            node.vm,
            job_name,
        )
        assert worker.state == "revoked"  # the job ended: its workers are revoked
    vms = {v.vm: v for v in rows(sqlite_records, VmRecord)}
    assert {v.status for v in vms.values()} == {"terminated"}
    assert all(v.terminated_at is not None and v.instance_ids for v in vms.values())
    tokens = rows(sqlite_records, JoinToken)
    assert len(tokens) == 2 and all(t.used_at is not None for t in tokens)
    assert len(plaintexts) == 2 and None not in plaintexts
    assert {t.token_sha256 for t in tokens} == {Records.hash_token(p) for p in plaintexts}
    estimate = [c for c in rows(sqlite_records, CostRecord) if c.kind == "estimate"]
    assert [(c.amount, c.source) for c in estimate] == [(20.0, "simulated")]
    assert final.state is JobState.COMPLETED


async def test_incompatible_capabilities_tear_down_block_and_fail_over(
    client, task_queue, job_name, sqlite_records, api_url
):
    broken = FaultRule(primitive="create", effect="bad_runtime", offer=OFFER_A)
    async with fake_worker(client, task_queue, agent_cloud(broken), sqlite_records, api_url) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name))
        at_ready, final = await ready_then_release(handle)
        assert_nothing_left(cloud)

    first, second = at_ready.attempts
    assert (first.offer.id, first.kind, first.step) == (OFFER_A, ErrorKind.FAILED, "register")
    assert "GPU runtime not working: Failed to initialize NVML" in (first.message or "")
    assert second.offer.id == OFFER_B and second.outcome is AttemptOutcome.SUCCEEDED
    assert [(b.key, b.kind) for b in at_ready.blocks] == [(OFFER_A, ErrorKind.FAILED)]
    assert at_ready.nodes[0].status == "terminated"
    worker_states = sorted(w.state for w in rows(sqlite_records, WorkerRecord))
    assert worker_states == ["revoked", "revoked"]
    assert final.state is JobState.COMPLETED


async def test_a_node_that_cannot_reach_a_down_control_plane_blocks_no_offer(
    client, task_queue, job_name, sqlite_records
):
    """The API is down (nothing listens where nodes are told to register): every node's
    registration times out, but the outage is ours, so no offer is blocked for other jobs."""
    down = f"http://127.0.0.1:{free_port()}"
    config = agent_cloud(boot_timeout=2)
    async with fake_worker(client, task_queue, config, sqlite_records, down) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, provisioning_timeout_seconds=60))
        final = await asyncio.wait_for(handle.result(), 90)
        assert_nothing_left(cloud)
    assert final.state is JobState.FAILED
    assert final.attempts, final.error
    for attempt in final.attempts:
        assert attempt.step == "await_registrations", attempt
        assert "control plane was out" in (attempt.message or ""), attempt.message
    assert final.blocks == []
    assert rows(sqlite_records, BlockRecord) == []


async def test_a_node_that_never_registers_while_the_control_plane_is_up_blocks_its_offer(
    client, task_queue, job_name, sqlite_records, api_url
):
    """The same timeout with the API answering: the cloud's machine never came up as a node,
    so its offer is blocked (the control case of the test above)."""
    silent = FaultRule(primitive="create", effect="no_agent", offer=OFFER_A)
    async with fake_worker(
        client, task_queue, agent_cloud(silent, boot_timeout=2), sqlite_records, api_url
    ) as (gpuprov, cloud):
        at_ready, _ = await ready_then_release(await gpuprov.submit(job(job_name)))
        assert_nothing_left(cloud)
    first = at_ready.attempts[0]
    assert (first.offer.id, first.step) == (OFFER_A, "await_registrations")
    assert "control plane" not in (first.message or "")
    assert [(b.key, b.kind) for b in at_ready.blocks] == [(OFFER_A, ErrorKind.FAILED)]


async def test_a_block_recorded_by_one_job_steers_the_next_until_it_expires(
    client, task_queue, job_name, sqlite_records
):
    stockout = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, offer=OFFER_A, times=1)
    async with fake_worker(client, task_queue, fast_cloud([stockout]), sqlite_records) as (
        gpuprov,
        _cloud,
    ):
        first, _ = await ready_then_release(await gpuprov.submit(job(f"{job_name}-1")))
        assert [a.offer.id for a in first.attempts] == [OFFER_A, OFFER_B]

        second, _ = await ready_then_release(await gpuprov.submit(job(f"{job_name}-2")))
        assert [a.offer.id for a in second.attempts] == [OFFER_B]  # A skipped, never tried
        assert [(b.key, b.kind) for b in second.blocks] == [(OFFER_A, ErrorKind.CAPACITY)]

        # expire the shared block (as the TTL would), and the next job tries A again
        with sqlite_records.db.session() as session:
            from gpuprov.store.db import BlockRecord

            for block in session.exec(select(BlockRecord)).all():
                block.expires_at = datetime.now(UTC) - timedelta(seconds=1)
                session.add(block)
            session.commit()
        third, _ = await ready_then_release(await gpuprov.submit(job(f"{job_name}-3")))
        assert [a.offer.id for a in third.attempts] == [OFFER_A]


def _capabilities_json(gpus: int = 8) -> dict:
    return WorkerCapabilities.model_validate(
        {
            "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}] * gpus,
            "cpu_count": 64,
            "memory_gb": 512,
            "gpu_runtime_ok": True,
        }
    ).model_dump(mode="json")


async def _join_existing(api_url: str, records: Records, label: str) -> str:
    import httpx

    token = records.mint_token(label=label, ttl=timedelta(minutes=5))
    async with httpx.AsyncClient(base_url=api_url) as http:
        response = await http.post(
            "/v1/workers/register", json={"token": token, "capabilities": _capabilities_json()}
        )
    assert response.status_code == 200, response.text
    return response.json()["worker_id"]


async def test_an_idle_existing_worker_is_used_before_any_cloud_machine(
    client, task_queue, job_name, sqlite_records, api_url
):
    worker_id = await _join_existing(api_url, sqlite_records, "gpu-box-1")
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records, api_url) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name))
        at_ready = await until(handle, lambda s: s.state is JobState.READY)
        assert [w.worker_id for w in at_ready.existing_workers] == [worker_id]
        assert at_ready.attempts == [] and at_ready.nodes == []
        assert sqlite_records.get_worker(worker_id).state == "busy"  # placed: the job runs on it
        await handle.release()
        final = await handle.result()
        assert cloud.state.creates_per_vm() == {}  # no cloud machine was paid for
    assert final.state is JobState.COMPLETED
    assert sqlite_records.get_worker(worker_id).state == "idle"  # free for the next job


async def test_many_jobs_racing_for_one_existing_worker_only_one_gets_it(
    client, task_queue, job_name, sqlite_records, api_url
):
    worker_id = await _join_existing(api_url, sqlite_records, "gpu-box-2")
    placement = {"provisioning": False}
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records, api_url) as (
        gpuprov,
        _cloud,
    ):
        handles = [
            await gpuprov.submit(job(f"{job_name}-{i}", placement=placement)) for i in range(6)
        ]
        ends = await asyncio.gather(
            *(until(h, lambda s: s.state in (JobState.READY, JobState.FAILED)) for h in handles)
        )
        winners = [s for s in ends if s.state is JobState.READY]
        assert len(winners) == 1
        assert [w.worker_id for w in winners[0].existing_workers] == [worker_id]
        losers = [s for s in ends if s.state is JobState.FAILED]
        assert len(losers) == len(handles) - 1
        assert all("no existing worker is eligible" in (s.error or "") for s in losers)
        winner = handles[ends.index(winners[0])]
        await winner.release()
        await winner.result()
        with pytest.raises(JobNotFound, match="no running job"):
            await handles[ends.index(losers[0])].release()
    assert sqlite_records.get_worker(worker_id).state == "idle"


async def test_no_secret_ever_enters_temporal_history(
    client, task_queue, job_name, postgres_scratch
):
    """Every join token (minted per node, and an operator's) and the configured database
    password are absent from every history of the run, including the offers workflow."""
    password = f"db-secret-{job_name}"
    url = sa.make_url(postgres_scratch.create()).set(password=password)
    url_text = url.render_as_string(hide_password=False)
    records = open_records(url_text)  # trust auth: the password is configured, not checked
    lost = FaultRule(primitive="create", effect="lost_response", times=1)
    try:
        async with (
            control_plane(client, records) as api,
            fake_worker(client, task_queue, agent_cloud(lost), records, api) as (gpuprov, cloud),
        ):
            handle = await gpuprov.submit(job(job_name, nodes=2))
            await ready_then_release(handle)
            await gpuprov.offers(OffersQuery(request=ResourceRequest(gpu="H100")))
            secrets = {row.join_token for row in cloud.state.instances() if row.join_token}
            secrets.add(records.mint_token(label="never-used", ttl=timedelta(minutes=5)))
    finally:
        records.db.dispose()
        postgres_scratch.drop(url_text)
    assert len(secrets) == 3  # a token per node, and one operator token
    secrets.add(password)
    histories = []
    async for execution in client.list_workflows(f"TaskQueue = '{task_queue}'"):
        history = await client.get_workflow_handle(execution.id).fetch_history()
        histories.append(decoded_history(history))
    assert len(histories) == 2  # the job and the offers query
    assert any(f"{job_name}-a1-n0-" in text for text in histories)  # payloads are decoded
    for text in histories:
        for secret in secrets:
            assert secret not in text
            assert json.dumps(secret)[1:-1] not in text


async def test_a_registration_for_a_vm_the_job_is_not_waiting_for_never_becomes_its_node(
    client, task_queue, job_name, sqlite_records, api_url
):
    import httpx

    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records, api_url) as (
        gpuprov,
        _cloud,
    ):
        handle = await gpuprov.submit(job(job_name))
        ready = await until(handle, lambda s: s.state is JobState.READY)
        # a VM row of this job run that is not a node of its current attempt (a stale attempt)
        stray = f"{job_name}-a9-n0-{ready.run}"
        sqlite_records.record_vm(
            job=job_name,
            node_index=0,
            attempt=9,
            vm=stray,
            provider="fake",
            region="r1",
            zone="r1-a",
        )
        token = sqlite_records.mint_token(vm=stray, ttl=timedelta(minutes=5))
        async with httpx.AsyncClient(base_url=api_url) as http:
            response = await http.post(
                "/v1/workers/register",
                json={"token": token, "capabilities": _capabilities_json()},
            )
        assert response.status_code == 200, response.text  # a real token for a real row
        after = await handle.status()
        assert [n.worker_id for n in after.nodes] == [n.worker_id for n in ready.nodes]
        assert response.json()["worker_id"] not in {n.worker_id for n in after.nodes}
        await handle.release()
        await handle.result()
    # the job's ending revoked every worker of the job, the stray one included
    states = {w.vm: w.state for w in rows(sqlite_records, WorkerRecord)}
    assert states[stray] == "revoked"


async def test_a_forged_registration_update_is_refused_and_changes_nothing(
    client, task_queue, job_name, sqlite_records, api_url
):
    """Anyone who reaches Temporal can send an Update; a job takes registrations only from the
    database rows its nodes' tokens created, so the old `register_worker` Update does not
    exist, and a job waiting for its node stays waiting."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    slow = agent_cloud(boot_delay_seconds=600, boot_timeout=900)
    async with fake_worker(client, task_queue, slow, sqlite_records, api_url) as (gpuprov, _):
        handle = await gpuprov.submit(job(job_name))
        waiting = await until(handle, lambda s: bool(s.nodes) and s.nodes[0].instance_ids)
        forged = {
            "vm": waiting.nodes[0].vm,
            "worker_id": "invented",
            "capabilities": _capabilities_json(),
        }
        workflow = client.get_workflow_handle(f"job-{job_name}")
        with pytest.raises((WorkflowUpdateFailedError, RPCError)):
            await workflow.execute_update("register_worker", forged)
        status = await handle.status()
        assert status.state is JobState.PROVISIONING
        assert [n.worker_id for n in status.nodes] == [None]
        assert rows(sqlite_records, WorkerRecord) == []
        await workflow.cancel()


async def test_a_job_name_used_again_gets_its_own_vm_identities_and_rows(
    client, task_queue, job_name, sqlite_records, api_url
):
    async with fake_worker(client, task_queue, agent_cloud(), sqlite_records, api_url) as (
        gpuprov,
        cloud,
    ):
        first, _ = await ready_then_release(await gpuprov.submit(job(job_name)))
        handle = await gpuprov.submit(job(job_name))  # the first run ended: the name is free
        second = await until(handle, lambda s: s.state is JobState.READY)
        assert first.nodes[0].vm != second.nodes[0].vm  # each run has its own identity
        rows_by_vm = {v.vm: v for v in sqlite_records.vms_for_job(job_name)}
        assert rows_by_vm[first.nodes[0].vm].status == "terminated"
        assert rows_by_vm[second.nodes[0].vm].status == "running"  # placed
        workers = {w.vm: w.state for w in rows(sqlite_records, WorkerRecord)}
        assert workers == {first.nodes[0].vm: "revoked", second.nodes[0].vm: "busy"}
        await handle.release()
        await handle.result()
        assert sorted(cloud.state.creates_per_vm().values()) == [1, 1]
        assert_nothing_left(cloud)


async def test_release_keep_records_the_machines_as_kept_and_leaves_them_running(
    client, task_queue, job_name, sqlite_records, api_url
):
    async with fake_worker(client, task_queue, agent_cloud(), sqlite_records, api_url) as (
        gpuprov,
        cloud,
    ):
        _, final = await ready_then_release(await gpuprov.submit(job(job_name, release="keep")))
        assert final.state is JobState.COMPLETED
        assert [n.status for n in final.nodes] == ["kept"]
        assert len(cloud.live_instances()) == 1  # the user asked to keep it
        assert [v.status for v in sqlite_records.vms_for_job(job_name)] == ["kept"]
        assert sqlite_records.open_orphans() == []  # kept on purpose is not an orphan
