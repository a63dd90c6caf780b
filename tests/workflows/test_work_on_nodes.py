"""Jobs whose work runs on their nodes, for real: the fake cloud boots the real node agent
(`agent = "real"`: agent.pyz `run` per instance, its work under `supervise` in a process
group of its own), through the real API (which wakes the job itself) and the real dev server.
The work is shell on this machine; what it leaves behind (timestamps, process ids) is the
witness. The simulated agent's execution of the same work is checked at the end."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import FaultRule, JobsSettings, WorkersSettings
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState, JobStatus, WorkState
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from providers.fake import FakeCloud, FakeCloudState
from tests.gpuprov.test_agent_work import gone
from tests.helpers import (
    OFFER_A,
    OFFER_B,
    assert_nothing_left,
    eventually,
    fake_worker,
    fast_cloud,
    job,
    until,
)
from tests.test_worker_restart import REPO, Stack

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

FAST = WorkersSettings(heartbeat_interval_seconds=0.3, lost_after_seconds=5)
JOBS = JobsSettings(stop_grace_seconds=3)


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    yield records
    records.db.dispose()


@asynccontextmanager
async def real_nodes(
    client: Client, task_queue: str, records: Records, *faults: FaultRule, agent: str = "real"
) -> AsyncIterator[tuple[GpuprovClient, FakeCloud]]:
    """The API (waking jobs through `client`) on a free port, and a worker whose fake cloud
    boots the real agent (or the simulated one) on every instance."""
    port = free_port()
    app = create_app(records, workers=FAST, jobs=JOBS, temporal=client)
    async with serving(app, "127.0.0.1", port):
        config = fast_cloud(list(faults), agent=agent, boot_timeout=60)
        url = f"http://127.0.0.1:{port}"
        async with fake_worker(client, task_queue, config, records, api_url=url) as pair:
            yield pair


def work_groups(cloud: FakeCloud) -> list[int]:
    """The process groups of the work running on the cloud's nodes now."""
    return [group for machine in cloud.nodes.values() for group in machine.work_groups()]


async def ended_watching_work(handle, cloud: FakeCloud) -> tuple[JobStatus, set[int]]:
    """The job's final status, and every work process group seen on its nodes meanwhile."""
    result = asyncio.ensure_future(asyncio.wait_for(handle.result(), 120))
    seen: set[int] = set()
    while not result.done():
        seen.update(work_groups(cloud))
        await asyncio.sleep(0.05)
    return result.result(), seen


def gpuprov_logs(client: Client, task_queue: str, records: Records, *args: str):
    """`gpuprov logs ...` as a user runs it, with a config naming this test's database."""
    config = Path(records.db.url.database).with_name("gpuprov.toml")  # type: ignore[arg-type]
    config.write_text(
        f'[temporal]\naddress = "{client.service_client.config.target_host}"\n'
        f'task_queue = "{task_queue}"\n[database]\nurl = "sqlite:///{records.db.url.database}"\n'
    )
    return subprocess.run(
        [sys.executable, "-m", "gpuprov.cli.main", "--config", str(config), "logs", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


async def test_a_two_node_run_completes_on_its_own_and_gpuprov_logs_shows_both_ranks(
    client, task_queue, job_name, sqlite_records
):
    run = 'echo "hello from rank $GPUPROV_NODE_RANK of $GPUPROV_NUM_NODES"'
    async with real_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, 2, run=run, setup="echo setting up >&2"))
        final = await asyncio.wait_for(handle.result(), 120)
        assert_nothing_left(cloud)
        assert not any(machine.running() for machine in cloud.nodes.values())
    assert final.state is JobState.COMPLETED, final.error
    assert [(w.state, w.exit_code) for w in final.work] == [(WorkState.EXITED, 0)] * 2
    assert final.restarts == [] and final.ready_at is not None

    shown = await asyncio.to_thread(gpuprov_logs, client, task_queue, sqlite_records, job_name)
    assert shown.returncode == 0, shown.stderr
    assert sorted(shown.stdout.splitlines()) == [
        "[0] hello from rank 0 of 2",
        "[1] hello from rank 1 of 2",
    ]
    assert sorted(shown.stderr.splitlines()) == ["[0] setting up", "[1] setting up"]
    one = await asyncio.to_thread(
        gpuprov_logs, client, task_queue, sqlite_records, job_name, "--node", "1", "--follow"
    )
    assert (one.returncode, one.stdout) == (0, "[1] hello from rank 1 of 2\n"), one.stderr

    sdk = GpuprovClient(client, task_queue, database_url=str(sqlite_records.db.url))
    lines = [line async for line in sdk.logs(job_name, follow=True)]
    assert sorted((line.node, line.stream, line.text) for line in lines) == [
        (0, "stderr", "setting up"),
        (0, "stdout", "hello from rank 0 of 2"),
        (1, "stderr", "setting up"),
        (1, "stdout", "hello from rank 1 of 2"),
    ]


async def test_a_node_exiting_3_fails_the_job_naming_the_node_and_the_other_is_stopped(
    client, task_queue, job_name, sqlite_records
):
    run = '[ "$GPUPROV_NODE_RANK" = 1 ] && { echo "rank 1 gives up"; exit 3; }; exec sleep 3600'
    async with real_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, 2, run=run))
        final, groups = await ended_watching_work(handle, cloud)
        assert_nothing_left(cloud)
    assert final.state is JobState.FAILED
    assert final.error is not None and "node 1" in final.error and "code 3" in final.error
    assert "rank 1 gives up" in final.error
    states = {w.rank: (w.state, w.exit_code) for w in final.work}
    assert states == {0: (WorkState.STOPPED, -15), 1: (WorkState.EXITED, 3)}
    assert groups and all(gone(group) for group in groups)


def intervals(events: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """(rank, shell pid) -> (first, last) time its work wrote."""
    seen: dict[tuple[str, str], list[float]] = {}
    for line in events.read_text().splitlines():
        _, rank, pid, at = line.split()
        seen.setdefault((rank, pid), []).append(float(at))
    return {key: (min(times), max(times)) for key, times in seen.items()}


async def test_a_preempted_node_restarts_the_work_elsewhere_never_twice_at_once(
    client, task_queue, job_name, sqlite_records, tmp_path
):
    shared = tmp_path / "shared"
    shared.mkdir()
    events = shared / "events"
    # Each rank's first run writes every 0.1 s and never ends; its second ends at once.
    run = (
        f'note() {{ echo "$1 $GPUPROV_NODE_RANK $$ $(date +%s.%N)" >> {events}; }}; note start; '
        f"if mkdir {shared}/ran-$GPUPROV_NODE_RANK 2>/dev/null; then "
        "while :; do note alive; sleep 0.1; done; fi; note end"
    )
    spec = job(job_name, 2, run=run, health_check_interval_seconds=1, recovery={"max_restarts": 1})
    async with real_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(spec)
        running = await until(handle, lambda s: s.state is JobState.RUNNING, 120)
        assert running.attempts[-1].offer.id == OFFER_A
        await eventually(
            lambda: events.exists() and len(intervals(events)) == 2, "both nodes' work", 60
        )
        first = running.live_nodes()[0]
        [instance] = [row for row in cloud.live_instances() if row.vm == first.vm]
        await asyncio.to_thread(cloud.nodes[instance.id].kill)  # the machine is gone...
        cloud.state.preempt(instance.id)  # ...and its cloud says so
        final = await asyncio.wait_for(handle.result(), 120)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED, final.error
    assert [a.offer.id for a in final.attempts] == [OFFER_A, OFFER_B]
    assert len(final.restarts) == 1 and "preempted" in final.restarts[0].cause
    runs = intervals(events)
    by_rank = {
        rank: sorted(times for (of, _), times in runs.items() if of == rank) for rank in "01"
    }
    assert [len(by_rank[rank]) for rank in "01"] == [2, 2]  # twice per rank in all
    first_ended = max(by_rank[rank][0][1] for rank in "01")
    second_started = min(by_rank[rank][1][0] for rank in "01")
    assert first_ended < second_started  # never two at once


async def test_cancel_while_running_ends_the_work_and_leaves_nothing(
    client, task_queue, job_name, sqlite_records
):
    async with real_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, 2, run="sleep 3600"))
        groups = await eventually(lambda: len(work_groups(cloud)) == 2 and work_groups(cloud),
                                  "both nodes' work running", 60)  # fmt: skip
        assert not any(gone(group) for group in groups)
        await handle.cancel()
        final = await asyncio.wait_for(handle.result(), 120)
        assert_nothing_left(cloud)
    assert final.state is JobState.CANCELLED
    # The nodes' agents stopped it (SIGTERM) and said so, before the machines went.
    assert [(w.state, w.exit_code) for w in final.work] == [(WorkState.STOPPED, -15)] * 2
    assert all(gone(group) for group in groups)


async def test_max_runtime_releases_a_job_whose_work_never_ends(
    client, task_queue, job_name, sqlite_records
):
    async with real_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, run="sleep 3600", max_runtime_seconds=5))
        [group] = await eventually(lambda: work_groups(cloud), "the work running", 60)
        final = await asyncio.wait_for(handle.result(), 120)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED
    assert [(w.state, w.exit_code) for w in final.work] == [(WorkState.STOPPED, -15)]
    assert gone(group)


# ---------------------------------------------------------------- the worker dies mid-run


def ledger_is_empty(path: Path) -> bool:
    ledger = FakeCloudState(str(path))
    try:
        return ledger.live_instances(delete_delay=0.2) == [] and not ledger.live_side_resources()
    finally:
        ledger.close()


async def test_a_worker_killed_mid_run_the_job_goes_on_and_the_work_started_once(
    client, task_queue, job_name, tmp_path
):
    database = f"sqlite:///{tmp_path / 'gpuprov.db'}"
    records = open_records(database)
    port = free_port()
    starts = tmp_path / "starts"
    config = tmp_path / "gpuprov.toml"
    config.write_text(
        f'[temporal]\naddress = "{client.service_client.config.target_host}"\n'
        f'task_queue = "{task_queue}"\n[database]\nurl = "{database}"\n[api]\nport = {port}\n'
        "[providers.fake]\nboot_delay_seconds = 0.2\ndelete_delay_seconds = 0.2\n"
        'poll_interval = 0.2\nboot_timeout = 60\nagent = "real"\n'
        f'agent_root = "{tmp_path / "nodes"}"\nstate_path = "{tmp_path / "ledger.db"}"\n'
        'regions = [{ name = "r1", zones = ["r1-a"] }]\n'
        'instance_types = [{ name = "gpu8", gpu = "H100", gpu_count = 8, price = 10.0 }]\n'
    )
    run = f"echo started >> {starts}; sleep 6; echo done"
    stack = Stack(config, tmp_path / "worker.log", tmp_path / "ledger.db", records)
    app = create_app(records, workers=FAST, jobs=JOBS, temporal=client)
    async with serving(app, "127.0.0.1", port):
        stack.start_worker()
        try:
            handle = await GpuprovClient(client, task_queue).submit(
                job(job_name, run=run, health_check_interval_seconds=1)
            )
            await eventually(starts.exists, "the work started", 90)
            stack.kill_worker()  # its agents die with it; the work goes on
            stack.start_worker()  # the next observe boots the agent again, in the same root
            final = await asyncio.wait_for(handle.result(), 120)
        finally:
            stack.stop_worker()
            records.db.dispose()
    assert final.state is JobState.COMPLETED, (final.error, stack.log.read_text()[-3000:])
    assert starts.read_text() == "started\n"  # once
    [work] = final.work
    assert (work.state, work.exit_code) == (WorkState.EXITED, 0)
    assert "done" in (work.tail or "")
    assert ledger_is_empty(tmp_path / "ledger.db")
    [agent_log] = (tmp_path / "nodes").glob("*/agent.log")
    assert "known from before a restart" in agent_log.read_text()


# ---------------------------------------------------------------- the simulated agent


async def test_the_simulated_agent_runs_the_work_too(
    client, task_queue, job_name, sqlite_records, tmp_path
):
    # Rank 1 fails only once rank 0 has started: a stop that found rank 0 not yet started
    # would end it without an exit code (and without its log line).
    started = tmp_path / "rank0-started"
    run = (
        f'if [ "$GPUPROV_NODE_RANK" = 1 ]; then until [ -e {started} ]; do sleep 0.1; done; '
        f'exit 3; fi; echo "rank $GPUPROV_NODE_RANK"; touch {started}; sleep 3600'
    )
    async with real_nodes(client, task_queue, sqlite_records, agent="simulated") as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name, 2, run=run))
        final = await asyncio.wait_for(handle.result(), 120)
        assert_nothing_left(cloud)
    assert final.state is JobState.FAILED and "node 1" in (final.error or "")
    states = {w.rank: (w.state, w.exit_code) for w in final.work}
    assert states == {0: (WorkState.STOPPED, -15), 1: (WorkState.EXITED, 3)}
    sdk = GpuprovClient(client, task_queue, database_url=str(sqlite_records.db.url))
    assert [(line.node, line.text) async for line in sdk.logs(job_name)] == [(0, "rank 0")]
