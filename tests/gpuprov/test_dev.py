"""`gpuprov dev`: dev server with UI + worker on the embedded default (fake cloud), until Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from gpuprov.cli.dev import free_port
from gpuprov.models import JobState
from gpuprov.sdk.client import GpuprovClient
from tests.helpers import job

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

GPUPROV = str(Path(sys.executable).parent / "gpuprov")


async def test_dev_serves_ui_runs_a_job_on_the_fake_cloud_and_stops_cleanly(tmp_path, job_name):
    port, ui_port = free_port(), free_port()
    env = {
        **os.environ,
        "GPUPROV_TEMPORAL__ADDRESS": f"127.0.0.1:{port}",
        "GPUPROV_TEMPORAL__UI_PORT": str(ui_port),
        "GPUPROV_TEMPORAL__DATA_DIR": str(tmp_path / "data"),
    }
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        "dev",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    assert process.stdout is not None
    try:
        seen = []
        while not any("Ctrl-C stops" in line for line in seen):
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            assert line, "gpuprov dev exited early:\n" + "".join(seen)
            seen.append(line.decode())
        assert f"Web UI at http://127.0.0.1:{ui_port}" in "".join(seen)
        assert "reconciler schedule gpuprov-reconcile: created (every 300s" in "".join(seen)
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{ui_port}/")).status_code == 200

        gpuprov = await GpuprovClient.connect(f"127.0.0.1:{port}")
        handle = await gpuprov.submit(job(job_name, provisioning_timeout_seconds=60))
        ready = await handle.wait_ready(timeout=60)
        assert ready.nodes[0].provider == "fake"
        await handle.release()
        assert (await handle.result()).state is JobState.COMPLETED
    finally:
        process.send_signal(signal.SIGINT)
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0
    assert (tmp_path / "data" / "temporal.db").is_file()
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError("gpuprov dev left a process running")
