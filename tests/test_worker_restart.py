"""A worker SIGKILLed while its job waits for running comes back and finishes the job without a
second instance: Temporal history is the journal, the fake cloud's ledger file is the witness."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpuprov.client import GpuprovClient
from gpuprov.models import JobState
from providers.fake import FakeCloudState
from tests.helpers import job, until

REPO = Path(__file__).resolve().parents[1]


def _write_config(path: Path, address: str, task_queue: str, state_path: Path) -> None:
    path.write_text(
        f"""
[temporal]
address = "{address}"
task_queue = "{task_queue}"

[providers.fake]
boot_delay_seconds = 6
delete_delay_seconds = 0.2
poll_interval = 0.2
boot_timeout = 60
state_path = "{state_path}"
regions = [{{ name = "r1", zones = ["r1-a"] }}]
instance_types = [{{ name = "gpu8", gpu = "H100", gpu_count = 8, price = 10.0 }}]
"""
    )


def _start_worker(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(REPO / "worker.py"), "--config", str(config)],
        cwd=REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


async def test_worker_killed_while_waiting_for_running_finishes_without_duplicate(
    client, temporal_env, task_queue, job_name, tmp_path
):
    state_path = tmp_path / "fake-cloud.db"
    config = tmp_path / "gpuprov.toml"
    log = tmp_path / "worker.log"
    address = client.service_client.config.target_host
    _write_config(config, address, task_queue, state_path)
    gpuprov = GpuprovClient(client, task_queue)

    worker = _start_worker(config, log)
    try:
        handle = await gpuprov.submit(job(job_name, nodes=2))
        waiting = await until(handle, lambda s: (s.waiting_for or "").startswith("running"), 60)
        assert waiting.state is JobState.PROVISIONING, log.read_text()
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)

        worker = _start_worker(config, log)
        ready = await until(handle, lambda s: s.state is JobState.READY, 90)
        assert ready.state is JobState.READY, log.read_text()
        await handle.release()
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state is JobState.COMPLETED
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()

    ledger = FakeCloudState(str(state_path))
    try:
        assert ledger.creates_per_vm() == {f"{job_name}-a1-n0": 1, f"{job_name}-a1-n1": 1}
        assert ledger.live_instances(delete_delay=0.2) == []
        assert ledger.live_side_resources() == []
    finally:
        ledger.close()
