"""A job name submitted again is a new run that owns its rows: it runs its work on its own
nodes (the real agent, the real API, the real dev server), whatever the earlier run left in the
database, and the earlier run's rows stay exactly as they were, readable with `--run`."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import col, select

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.models import JobState, JobStatus, WorkState
from gpuprov.store.db import CostRecord, LogChunk, VmRecord, WorkRecord
from gpuprov.store.records import Records
from providers.fake.node import DEFAULT_FIXTURES, HEALTHY, stub_script
from tests.gpuprov.test_agent import install_nvidia_smi
from tests.gpuprov.test_join import ControlPlane, clean_env, join_with_new_token
from tests.helpers import assert_nothing_left, eventually, fake_worker, fast_cloud, job, until
from tests.test_worker_restart import REPO
from tests.workflows.test_work_on_nodes import FAST, JOBS, real_nodes, sqlite_records

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

__all__ = ["sqlite_records"]  # the fixture, used by name

RUN_TABLES = (WorkRecord, LogChunk, CostRecord, VmRecord)


def rows_of_job(records: Records, job: str) -> dict[str, set[tuple[str, ...]]]:
    """Every row of the job's name in the tables a run writes, column by column."""
    found = {}
    with records.db.engine.connect() as connection:
        for table in RUN_TABLES:
            columns = table.__table__  # type: ignore[attr-defined]
            rows = connection.execute(sa.select(columns).where(columns.c.job == job)).all()
            found[table.__tablename__] = {tuple(map(str, row)) for row in rows}
    return found


def untouched(earlier: dict[str, set[tuple[str, ...]]], now: dict[str, set[tuple[str, ...]]]):
    """Every row there was is still there, exactly as it was."""
    for table, rows in earlier.items():
        assert rows <= now[table], f"{table}: rows of the earlier run changed or went"


def gpuprov_cli(client, task_queue: str, records: Records, *args: str):
    """`gpuprov ...` as a user runs it, with a config naming this test's database."""
    config = Path(records.db.url.database).with_name("gpuprov.toml")  # type: ignore[arg-type]
    config.write_text(
        f'[temporal]\naddress = "{client.service_client.config.target_host}"\n'
        f'task_queue = "{task_queue}"\n[database]\nurl = "sqlite:///{records.db.url.database}"\n'
    )
    return subprocess.run(
        [sys.executable, "-m", "gpuprov.cli.main", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


async def finished(handle, timeout: float = 120) -> JobStatus:
    return await asyncio.wait_for(handle.result(), timeout)


def ran_on_its_own_nodes(status: JobStatus) -> None:
    """Every node of the run exited 0, each on this run's machine (its VM has the run's tag)."""
    assert {w.vm for w in status.work} == {node.vm for node in status.nodes}
    assert [(w.state, w.exit_code) for w in status.work] == [(WorkState.EXITED, 0)] * 2
    assert all(node.vm.endswith(f"-{status.run}") for node in status.nodes)


async def test_a_completed_name_submitted_again_runs_its_work_again_and_shows_each_run(
    client, task_queue, job_name, sqlite_records
):
    run = 'echo "rank $GPUPROV_NODE_RANK at $(date +%s%N)"'

    def cli(*args: str):
        return asyncio.to_thread(gpuprov_cli, client, task_queue, sqlite_records, *args)

    async with real_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud):
        first = await finished(await gpuprov.submit(job(job_name, 2, run=run)))
        kept = rows_of_job(sqlite_records, job_name)
        second = await finished(await gpuprov.submit(job(job_name, 2, run=run)))
        assert_nothing_left(cloud)
        ran_on_its_own_nodes(second)
        # The status query needs a worker: asked while this one runs.
        status, old_status = (
            await cli("status", job_name),
            await cli("status", job_name, "--run", first.run, "--json"),
        )
        assert f"run: {second.run}" in status.stdout, status.stderr
        assert JobStatus.model_validate_json(old_status.stdout).nodes == first.nodes

    assert first.state is second.state is JobState.COMPLETED, second.error
    assert first.run != second.run
    ran_on_its_own_nodes(first)
    ran_on_its_own_nodes(second)
    untouched(kept, rows_of_job(sqlite_records, job_name))
    assert len(kept["work"]) == 2 and kept["log_chunks"] and kept["cost_records"]
    with sqlite_records.db.engine.connect() as connection:  # each row names its run
        for table in RUN_TABLES:
            runs = sa.select(table.__table__.c.run).where(table.__table__.c.job == job_name)  # type: ignore[attr-defined]
            assert set(connection.execute(runs).scalars()) == {first.run, second.run}

    latest, earlier = await cli("logs", job_name), await cli("logs", job_name, "--run", first.run)
    assert latest.returncode == earlier.returncode == 0, latest.stderr + earlier.stderr
    assert len(latest.stdout.splitlines()) == len(earlier.stdout.splitlines()) == 2
    assert set(latest.stdout.splitlines()).isdisjoint(earlier.stdout.splitlines())
    assert [line.split(" at ")[0] for line in sorted(earlier.stdout.splitlines())] == [
        "[0] rank 0",
        "[1] rank 1",
    ]

    cost, old_cost = (
        await cli("cost", job_name, "--json"),
        await cli("cost", job_name, "--run", first.run, "--json"),
    )
    assert {m["vm"] for m in json.loads(cost.stdout)["machines"]} == {
        node.vm for node in second.nodes
    }
    assert {m["vm"] for m in json.loads(old_cost.stdout)["machines"]} == {
        node.vm for node in first.nodes
    }
    unknown = await cli("logs", job_name, "--run", "abcdef")
    assert unknown.returncode == 2 and "has no run 'abcdef'" in unknown.stderr


async def test_a_failed_name_submitted_again_runs_its_work_again_on_new_nodes(
    client, task_queue, job_name, sqlite_records, tmp_path
):
    # The first execution of rank 0 fails with 127; any later one finds the mark and succeeds.
    mark = tmp_path / "ran-once"
    run = f'[ "$GPUPROV_NODE_RANK" = 0 ] && [ ! -e {mark} ] && {{ touch {mark}; exit 127; }}; true'
    async with real_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud):
        first = await finished(await gpuprov.submit(job(job_name, 2, run=run)))
        kept = rows_of_job(sqlite_records, job_name)
        second = await finished(await gpuprov.submit(job(job_name, 2, run=run)))
        assert_nothing_left(cloud)
    assert first.state is JobState.FAILED and "127" in (first.error or "")
    assert second.state is JobState.COMPLETED, second.error
    ran_on_its_own_nodes(second)
    untouched(kept, rows_of_job(sqlite_records, job_name))


async def test_a_released_name_submitted_again_runs_its_work_until_released_again(
    client, task_queue, job_name, sqlite_records
):
    run = "exec sleep 3600"

    async def started_then_released(gpuprov) -> JobStatus:
        handle = await gpuprov.submit(job(job_name, 2, run=run))
        placed = await until(handle, lambda s: s.state is JobState.RUNNING, timeout=90)

        def started() -> bool:
            """This run's work started on both of this run's machines."""
            machines = [node.vm for node in placed.nodes]
            with sqlite_records.db.session() as session:
                rows = session.exec(
                    select(WorkRecord).where(col(WorkRecord.vm).in_(machines))
                ).all()
            return len(rows) == 2 and all(row.state == WorkState.STARTED.value for row in rows)

        await eventually(started, "this run's work started on both nodes", 60)
        await handle.release()
        return await finished(handle)

    async with real_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud):
        first = await started_then_released(gpuprov)
        kept = rows_of_job(sqlite_records, job_name)
        second = await started_then_released(gpuprov)
        assert_nothing_left(cloud)
    for status in (first, second):
        assert status.state is JobState.COMPLETED, status.error
        assert {w.state for w in status.work} == {WorkState.STOPPED}
        assert {w.vm for w in status.work} == {node.vm for node in status.nodes}
    untouched(kept, rows_of_job(sqlite_records, job_name))


async def test_a_joined_worker_runs_the_work_of_each_run_of_a_name(
    client, task_queue, job_name, sqlite_records, tmp_path
):
    """A box joined with `gpuprov join`, its agent run as join prints it: the first run of the
    name fails at its work, the second runs its own work on the same box and completes."""
    port = free_port()
    # The nvidia-smi the fake cloud's machines replay (its health check included).
    bin_dir = install_nvidia_smi(tmp_path / "bin", stub_script(DEFAULT_FIXTURES, HEALTHY, None, 0))
    plane = ControlPlane(
        records=sqlite_records,
        port=port,
        env=clean_env(
            GPUPROV_DATABASE__URL=str(sqlite_records.db.url),
            GPUPROV_API__PORT=str(port),
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            HOME=str(tmp_path / "home"),
        ),
    )
    mark = tmp_path / "ran-once"
    run = f'[ ! -e {mark} ] && {{ touch {mark}; exit 3; }}; echo "second time on $(hostname)"'
    app = create_app(sqlite_records, workers=FAST, jobs=JOBS, temporal=client)
    async with serving(app, "127.0.0.1", port):
        _, code, out, err = await join_with_new_token(plane, "box-1", tmp_path)
        assert code == 0, err
        agent = await asyncio.create_subprocess_exec(
            *shlex.split(out.rstrip().splitlines()[-1]), env=plane.env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            async with fake_worker(
                client, task_queue, fast_cloud(), sqlite_records, api_url=plane.url
            ) as (gpuprov, cloud):
                spec = job(job_name, run=run, placement={"provisioning": False})
                first = await finished(await gpuprov.submit(spec))
                second = await finished(await gpuprov.submit(spec))
                assert cloud.state.creates_per_vm() == {}
        finally:
            os.killpg(agent.pid, signal.SIGTERM)
            await asyncio.wait_for(agent.wait(), 30)
    assert first.state is JobState.FAILED and "exit" in (first.error or "")
    assert second.state is JobState.COMPLETED, second.error
    [worker] = second.existing_workers
    assert [(w.worker_id, w.state, w.exit_code) for w in second.work] == [
        (worker.worker_id, WorkState.EXITED, 0)
    ]
    assert first.existing_workers[0].worker_id == worker.worker_id  # the same box both times
    assert await eventually(
        lambda: sqlite_records.get_worker(worker.worker_id).state == "idle", "the box freed"
    )
