"""A job's end is the end of its work's main process (setup, then run) on every node, not of its
output, and nothing the work started outlives it: on the fake cloud's nodes with the real node
agent and with the simulated one, through the real API and the real dev server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuprov.engine.worker import open_records
from gpuprov.models import JobState, WorkState
from gpuprov.store.records import Records
from tests.gpuprov.test_agent_work_ends import alive
from tests.helpers import assert_nothing_left, job, kill_recorded_pids
from tests.workflows.test_work_on_nodes import real_nodes

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Iterator[Records]:
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    yield records
    records.db.dispose()


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Path]:
    """Where the work writes the pids of what it leaves running; killed at the end if alive."""
    folder = tmp_path / "pids"
    folder.mkdir()
    yield folder
    kill_recorded_pids(folder)


@pytest.mark.parametrize("agent", ["real", "simulated"])
async def test_a_background_sleep_in_run_does_not_keep_the_job_running(
    client,
    task_queue,
    job_name,
    sqlite_records,
    pids,
    agent,  # noqa: F811
):
    rank = "$GPUPROV_NODE_RANK"
    run = (
        f"sleep 120 & echo $! > {pids}/sleep-{rank}\n"
        f"setsid sleep 120 & echo $! > {pids}/setsid-{rank}\n"
        "echo started"
    )
    async with real_nodes(client, task_queue, sqlite_records, agent=agent) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, 2, run=run))
        started = time.monotonic()
        final = await asyncio.wait_for(handle.result(), 60)  # not the sleeps' 120 s
        left = {path.name for path in pids.iterdir() if alive(int(path.read_text()))}
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED, final.error
    assert [(w.state, w.exit_code) for w in final.work] == [(WorkState.EXITED, 0)] * 2
    assert len(list(pids.iterdir())) == 4 and left == set()
    assert time.monotonic() - started < 60
