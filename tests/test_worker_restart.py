"""Workers SIGKILLed at the worst moments come back and finish the job: no duplicate machine,
no orphan. Temporal history is the journal; the fake cloud's ledger file and the database are
the witnesses. The API runs in the test process, the worker in a subprocess sharing the
database file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from providers.fake import FakeCloudState
from tests.helpers import creates_by_node, eventually, job, until

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Stack:
    config: Path
    log: Path
    ledger: Path
    records: Records
    worker: subprocess.Popen[bytes] | None = None

    def start_worker(self) -> None:
        self.worker = subprocess.Popen(
            [sys.executable, str(REPO / "worker.py"), "--config", str(self.config)],
            cwd=REPO,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )

    def kill_worker(self) -> None:
        assert self.worker is not None
        os.kill(self.worker.pid, signal.SIGKILL)
        self.worker.wait(10)

    def stop_worker(self) -> None:
        if self.worker is None or self.worker.poll() is not None:
            return
        self.worker.send_signal(signal.SIGTERM)
        try:
            self.worker.wait(15)
        except subprocess.TimeoutExpired:
            self.worker.kill()


@asynccontextmanager
async def stack(
    client,
    task_queue: str,
    tmp_path: Path,
    fake: str,
    regions: str = '{ name = "r1", zones = ["r1-a"] }',
) -> AsyncIterator[Stack]:
    database = f"sqlite:///{tmp_path / 'gpuprov.db'}"
    records = open_records(database)
    port = free_port()
    config = tmp_path / "gpuprov.toml"
    config.write_text(
        f"""
[temporal]
address = "{client.service_client.config.target_host}"
task_queue = "{task_queue}"

[database]
url = "{database}"

[api]
port = {port}

[providers.fake]
delete_delay_seconds = 0.2
poll_interval = 0.2
boot_timeout = 60
simulate_agent = true
state_path = "{tmp_path / "fake-cloud.db"}"
regions = [{regions}]
instance_types = [{{ name = "gpu8", gpu = "H100", gpu_count = 8, price = 10.0 }}]
{fake}
"""
    )
    running = Stack(config, tmp_path / "worker.log", tmp_path / "fake-cloud.db", records)
    async with serving(create_app(records), "127.0.0.1", port):
        running.start_worker()
        try:
            yield running
        finally:
            running.stop_worker()
            records.db.dispose()


async def wait_for_db(records: Records, job_name: str, ready: Callable[[list], bool]) -> None:
    for _ in range(300):
        if ready(await asyncio.to_thread(records.vms_for_job, job_name)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the database never reached the expected state")


def booted(ledger_path: Path, machines: int, delay: float) -> bool:
    """The ledger holds `machines` instances, all created at least `delay` seconds ago (the
    fake cloud reports an instance Running once its boot delay has passed)."""
    ledger = FakeCloudState(str(ledger_path))
    try:
        rows = ledger.instances()
    finally:
        ledger.close()
    return len(rows) == machines and all(time.time() - row.created_at >= delay for row in rows)


async def finish_and_check(stack: Stack, handle, job_name: str, nodes: int) -> None:
    ready = await until(handle, lambda s: s.state is JobState.READY, 120)
    assert ready.state is JobState.READY, stack.log.read_text()[-3000:]
    running = [node for node in ready.nodes if node.status == "running"]
    assert len(running) == nodes and all(node.worker_id for node in running)
    await handle.release()
    final = await asyncio.wait_for(handle.result(), 60)
    assert final.state is JobState.COMPLETED
    ledger = FakeCloudState(str(stack.ledger))
    try:
        expected = {f"{job_name}-a1-n{i}": 1 for i in range(nodes)}
        assert creates_by_node(ledger) == expected  # no duplicate
        assert ledger.live_instances(delete_delay=0.2) == []
        assert ledger.live_side_resources() == []
    finally:
        ledger.close()
    assert stack.records.open_orphans() == []  # no orphan
    assert {v.status for v in stack.records.vms_for_job(job_name)} == {"terminated"}


async def test_worker_killed_between_recording_the_vm_and_creating_it(
    client, task_queue, job_name, tmp_path
):
    slow_create = '[[providers.fake.faults]]\nprimitive = "create"\neffect = "delay"\n'
    slow_create += "delay_seconds = 4\ntimes = 2\n"
    async with stack(client, task_queue, tmp_path, f"boot_delay_seconds = 1\n{slow_create}") as s:
        handle = await GpuprovClient(client, task_queue).submit(job(job_name, nodes=2))
        # both VM rows recorded, no instance yet: the create calls are in flight
        await wait_for_db(s.records, job_name, lambda vms: len(vms) == 2)
        assert {v.status for v in s.records.vms_for_job(job_name)} == {"recorded"}
        s.kill_worker()
        s.start_worker()
        await finish_and_check(s, handle, job_name, nodes=2)


async def test_worker_killed_between_creating_and_registering(
    client, task_queue, job_name, tmp_path
):
    async with stack(client, task_queue, tmp_path, "boot_delay_seconds = 5") as s:
        handle = await GpuprovClient(client, task_queue).submit(job(job_name, nodes=2))
        created = await until(handle, lambda st: (st.waiting_for or "").startswith("running"), 60)
        assert created.state is JobState.PROVISIONING, s.log.read_text()
        await wait_for_db(s.records, job_name, lambda vms: {v.status for v in vms} == {"created"})
        s.kill_worker()
        # the machines boot while no worker runs: the ledger shows both past their boot delay
        await eventually(lambda: booted(s.ledger, machines=2, delay=5), "both machines booted")
        s.start_worker()
        await finish_and_check(s, handle, job_name, nodes=2)


async def test_worker_killed_while_waiting_for_running_finishes_without_duplicate(
    client, task_queue, job_name, tmp_path
):
    async with stack(client, task_queue, tmp_path, "boot_delay_seconds = 6") as s:
        handle = await GpuprovClient(client, task_queue).submit(job(job_name, nodes=2))
        waiting = await until(handle, lambda st: (st.waiting_for or "").startswith("running"), 60)
        assert waiting.state is JobState.PROVISIONING, s.log.read_text()
        s.kill_worker()
        s.start_worker()
        await finish_and_check(s, handle, job_name, nodes=2)


async def test_worker_killed_mid_race_leaves_no_machine(client, task_queue, job_name, tmp_path):
    # A hedge: r1's machine never boots, r2's is started beside it a second later; the worker
    # dies while both are alive. The new worker finishes the race from history: r2 wins, r1's
    # machine is torn down, each created once.
    hang = '[[providers.fake.faults]]\nprimitive = "create"\neffect = "boot_hang"\n'
    hang += 'region = "r1"\n'
    regions = '{ name = "r1", zones = ["r1-a"] }, { name = "r2", zones = ["r2-a"] }'
    async with stack(client, task_queue, tmp_path, f"boot_delay_seconds = 3\n{hang}", regions) as s:
        spec = job(job_name, placement={"hedge": {"max_parallel": 2, "after_seconds": 1}})
        handle = await GpuprovClient(client, task_queue).submit(spec)
        await eventually(lambda: booted(s.ledger, machines=2, delay=0), "both attempts racing")
        s.kill_worker()
        s.start_worker()
        ready = await until(handle, lambda st: st.state is JobState.READY, 120)
        assert ready.state is JobState.READY, s.log.read_text()[-3000:]
        assert [(a.offer.region, a.outcome.value) for a in ready.attempts] == [
            ("r1", "lost_race"),
            ("r2", "succeeded"),
        ]
        await handle.release()
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.COMPLETED
        ledger = FakeCloudState(str(s.ledger))
        try:
            assert sorted(creates_by_node(ledger).values()) == [1, 1]  # no duplicate
            assert ledger.live_instances(delete_delay=0.2) == []
            assert ledger.live_side_resources() == []
        finally:
            ledger.close()
        assert s.records.open_orphans() == []
