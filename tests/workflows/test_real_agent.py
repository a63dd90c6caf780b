"""Jobs whose machines run the real node agent (`[providers.fake] agent = "real"`): each booted
fake instance runs its cloud-init unit: agent.pyz fetched from the API and checked against the
pin in the unit, then `run` in its own process group, given exactly the join.env the user data
writes, with a stub nvidia-smi replaying captured outputs. Real API,
real database, real dev server; small heartbeat intervals."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from activities.liveness import SweepReport
from gpuprov.api import node as api_node
from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import FakeProviderConfig, FaultRule, WorkersSettings
from gpuprov.contract import WatchInput
from gpuprov.engine.worker import open_records
from gpuprov.models import AttemptOutcome, JobState
from gpuprov.store.records import Records
from providers import agent_artifact
from providers.errors import ErrorKind, ProviderError
from providers.fake import FakeCloud
from providers.fake.config import FakeInstanceType
from providers.fake.node import AGENT_PATH, check_captured
from tests.helpers import OFFER_A, OFFER_B, assert_nothing_left, fake_worker, fast_cloud, job, until
from workflows.liveness import WatchWorkers

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

FAST = WorkersSettings(heartbeat_interval_seconds=0.3, lost_after_seconds=2)


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


@asynccontextmanager
async def real_agents(
    client: Client, task_queue: str, records: Records, *faults: FaultRule
) -> AsyncIterator[tuple[object, FakeCloud]]:
    """The API on a free port, and a worker whose fake cloud boots real agents."""
    port = free_port()
    async with serving(create_app(records, workers=FAST), "127.0.0.1", port):
        config = fast_cloud(list(faults), agent="real", boot_timeout=60)
        url = f"http://127.0.0.1:{port}"
        async with fake_worker(client, task_queue, config, records, api_url=url) as pair:
            yield pair


async def polled(predicate: Callable[[], object], what: str, timeout: float = 60) -> object:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := predicate()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)
    return value


async def sweep(client: Client, task_queue: str) -> SweepReport:
    return await client.execute_workflow(
        WatchWorkers.run,
        WatchInput(lost_after_seconds=FAST.lost_after_seconds),
        id=f"liveness-{uuid.uuid4().hex[:12]}",
        task_queue=task_queue,
        execution_timeout=timedelta(minutes=2),
    )


async def wake_ups(client: Client, job_name: str) -> int:
    history = await client.get_workflow_handle(f"job-{job_name}").fetch_history()
    return sum(
        event.workflow_execution_signaled_event_attributes.signal_name == "workers_changed"
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    )


def worker_of(records: Records, job_name: str):
    [worker] = [w for w in records.workers(job=job_name) if w.state != "revoked"]
    return worker


async def release(handle) -> None:
    await handle.release()
    await asyncio.wait_for(handle.result(), 60)


async def test_a_broken_gpu_runtime_fails_the_attempt_and_the_job_fails_over(
    client, task_queue, job_name, sqlite_records
):
    broken = FaultRule(primitive="create", offer=OFFER_A, effect="bad_runtime", times=1)
    async with real_agents(client, task_queue, sqlite_records, broken) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        ready = await until(handle, lambda s: s.state is JobState.READY, timeout=90)

        assert ready.state is JobState.READY, ready.error
        first, second = ready.attempts
        assert (first.offer.id, first.outcome, first.kind) == (
            OFFER_A,
            AttemptOutcome.FAILED,
            ErrorKind.FAILED,
        )
        assert "Driver/library version mismatch" in (first.message or "")
        assert (second.offer.id, second.outcome) == (OFFER_B, AttemptOutcome.SUCCEEDED)
        [placed] = ready.nodes[-1:]
        capabilities = placed.capabilities
        assert capabilities is not None and capabilities.gpu_runtime_ok
        assert [gpu.name for gpu in capabilities.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
        assert capabilities.driver_version == "550.90.07"
        assert capabilities.agent_version == "0.2.0"  # the real agent, not the simulated one
        [broken_node] = [m for m in cloud.nodes.values() if not m.running()]  # torn down
        assert "driver_mismatch" in broken_node.log.read_text()

        await release(handle)
        assert all(not machine.running() for machine in cloud.nodes.values())
        assert_nothing_left(cloud)


async def test_a_killed_agent_makes_its_worker_lost_and_its_job_is_told(
    client, task_queue, job_name, sqlite_records
):
    async with real_agents(client, task_queue, sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        await until(handle, lambda s: s.state is JobState.READY, timeout=90)
        worker = worker_of(sqlite_records, job_name)
        await polled(lambda: sqlite_records.get_worker(worker.id).heartbeats >= 2, "heartbeats")
        assert (await sweep(client, task_queue)).lost == []

        [machine] = [m for m in cloud.nodes.values() if m.running()]
        await asyncio.to_thread(machine.kill)  # the node dies: no more heartbeats

        async def lost() -> SweepReport:
            while True:
                report = await sweep(client, task_queue)
                if report.lost:
                    return report
                await asyncio.sleep(0.3)

        report = await asyncio.wait_for(lost(), 60)
        assert (report.lost, report.signalled) == ([worker.id], [job_name])
        assert sqlite_records.get_worker(worker.id).liveness == "lost"
        assert await wake_ups(client, job_name) == 1
        await release(handle)


async def test_an_ecc_error_on_a_running_node_is_heard_by_its_job(
    client, task_queue, job_name, sqlite_records
):
    ecc = FaultRule(primitive="create", effect="ecc_error", delay_seconds=3.0)
    async with real_agents(client, task_queue, sqlite_records, ecc) as (gpuprov, _):
        handle = await gpuprov.submit(job(job_name))
        ready = await until(handle, lambda s: s.state is JobState.READY, timeout=90)
        assert ready.nodes[0].capabilities and ready.nodes[0].capabilities.gpu_runtime_ok
        worker = worker_of(sqlite_records, job_name)

        sick = await polled(
            lambda: (row := sqlite_records.get_worker(worker.id)).health == "unhealthy" and row,
            "the unhealthy heartbeat",
        )

        assert "(Xid 48)" in sick.health_detail and sick.liveness == "alive"
        assert (await sweep(client, task_queue)).signalled == [job_name]
        assert await wake_ups(client, job_name) == 1
        await release(handle)


def every_environ() -> bytes:
    found = b""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found += (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return found


async def test_the_join_token_never_shows_in_ps_environ_logs_or_history(
    client, task_queue, job_name, sqlite_records
):
    async with real_agents(client, task_queue, sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        await until(handle, lambda s: s.state is JobState.READY, timeout=90)
        worker = worker_of(sqlite_records, job_name)
        await polled(lambda: sqlite_records.get_worker(worker.id).heartbeats >= 2, "heartbeats")
        [row] = cloud.live_instances()
        token = row.join_token
        assert token and len(token) >= 16
        [machine] = [m for m in cloud.nodes.values() if m.running()]
        credential = (machine.state_dir / "worker-credential").read_text().strip()

        ps = await asyncio.to_thread(
            subprocess.check_output, ["ps", "-eww", "-o", "args"], text=True
        )
        assert "agent.pyz run" in ps  # the agent is there to be seen
        proc = every_environ()
        log = machine.log.read_text()
        assert "registered as worker" in log
        history = (await client.get_workflow_handle(f"job-{job_name}").fetch_history()).to_json()
        for secret in (token, credential):
            assert secret not in ps and secret.encode() not in proc
            assert secret not in log and secret not in history
        env_file = machine.root / "etc/gpuprov/join.env"
        assert os.stat(env_file).st_mode & 0o777 == 0o600  # where cloud-init put it, only
        await release(handle)


async def test_a_node_refuses_a_tampered_agent_until_the_api_serves_the_pinned_one(
    client, task_queue, job_name, sqlite_records, monkeypatch
):
    good = agent_artifact.artifact()
    served = {"bytes": good.replace(b"AGENT_VERSION = ", b"AGENT_VERSION = 'x' or ")}
    monkeypatch.setattr(api_node, "agent_pyz", lambda: served["bytes"])
    async with real_agents(client, task_queue, sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        machine = await polled(lambda: next(iter(cloud.nodes.values()), None), "the machine")
        await polled(lambda: machine.log.exists() and "refused" in machine.log.read_text(), "no")
        [row] = cloud.live_instances()
        assert sqlite_records.workers(job=job_name) == []  # the tampered archive never ran
        assert not (machine.root / AGENT_PATH).exists()
        assert f"pinned {agent_artifact.sha256()}" in machine.log.read_text()

        served["bytes"] = good  # the unit's next try takes the pinned one, with the same token
        ready = await until(handle, lambda s: s.state is JobState.READY, timeout=90)
        assert ready.state is JobState.READY, ready.error
        assert (machine.root / AGENT_PATH).read_bytes() == good
        assert worker_of(sqlite_records, job_name).vm == row.vm
        await release(handle)


def test_the_real_agent_mode_is_one_setting_and_refuses_what_was_never_captured():
    assert FakeProviderConfig(agent="real").agent_mode == "real"
    assert FakeProviderConfig(simulate_agent=True).agent_mode == "simulated"
    assert FakeProviderConfig().agent_mode == "none"
    with pytest.raises(ValueError, match="contradicts"):
        FakeProviderConfig(simulate_agent=True, agent="real")
    cloud = FakeCloud(FakeProviderConfig(agent="real"))
    assert cloud.capabilities().node_agent
    cloud.state.close()
    with pytest.raises(ProviderError) as refused:
        check_captured(FakeInstanceType(name="a100x8", gpu="A100", gpu_count=8))
    assert refused.value.kind is ErrorKind.UNAVAILABLE
    h100x8 = FakeInstanceType(name="h100x8", gpu="H100", gpu_count=8)
    check_captured(h100x8)
    with pytest.raises(ProviderError, match="set \\[providers.fake\\] nvidia_smi_fixtures"):
        check_captured(h100x8, Path("/nonexistent"))
