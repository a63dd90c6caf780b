"""Teams and budgets inside the workflow (activities/teams.py, workflows/budget.py): real dev
server, real database (SQLite), the fake cloud at 10 USD per instance-hour.

A team's spend is planted as an actual cost record of one of its earlier runs this month; the
job is then refused at admission (naming the budget, the GPU limit, an unknown team or secret),
or admitted and released (or warned) by its running spend check once the team goes past. The
same job started with the `temporal` CLI and raw JSON is bound the same way."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuprov import contract
from gpuprov.config import JobsSettings
from gpuprov.engine.binaries import temporal_binary
from gpuprov.engine.worker import open_records
from gpuprov.models import JobState
from gpuprov.sdk.client import JobHandle
from gpuprov.store.db import CostRecord, utcnow
from gpuprov.store.records import Records
from gpuprov.store.teams import Teams
from tests.helpers import (
    assert_nothing_left,
    creates_by_node,
    eventually,
    fake_worker,
    fast_cloud,
    job,
    until,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

CHECK_EVERY = JobsSettings(budget_check_seconds=1)


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


def spend(records: Records, team: str, amount: float, job_name: str = "earlier") -> None:
    """`amount` USD spent by `team` this month: an earlier run's machine, gone."""
    run = f"{abs(hash((team, job_name, amount))) % 0xFFFFFF:06x}"
    Teams(records.db).admit_run(job_name, run, team, 8)
    with records.db.session() as session:
        session.add(
            CostRecord(
                job=job_name,
                run=run,
                kind="actual",
                amount=amount,
                currency="USD",
                unit="total",
                source="planted by the test",
                recorded_at=utcnow(),
                provider="fake",
                vm=f"{job_name}-a1-n0-{run}",
            )
        )
        session.commit()


async def failure_of(handle: JobHandle) -> str:
    final = await handle.result()
    assert final.state is JobState.FAILED and final.error is not None, final
    return final.error


async def test_a_job_over_what_is_left_of_its_teams_budget_is_refused_naming_it(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    Teams(sqlite_records.db).create("ml", monthly_budget_usd=100.0)
    spend(sqlite_records, "ml", 95.0)  # 95 %: 5 USD left; one node's first hour is 10
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, team="ml"))
        message = await failure_of(handle)
        status = await handle.status()
        assert creates_by_node(cloud.state) == {}  # nothing was created
    assert "refused: the monthly budget of team 'ml' is 100.00 USD, 95.00 spent" in message
    assert "5.00 left; the cheapest offer's estimate is 10.00 USD" in message
    assert status.state is JobState.FAILED and status.team == "ml"
    assert any("left of the monthly budget of team 'ml'" in line for line in status.rejected_offers)


async def test_a_job_within_the_budget_runs_and_a_shorter_estimate_fits(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    Teams(sqlite_records.db).create("ml", monthly_budget_usd=100.0)
    spend(sqlite_records, "ml", 95.0)
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, cloud):
        # 20 minutes on one 10 USD/h node: 3.33 USD, within the 5 left.
        handle = await gpuprov.submit(job(job_name, team="ml", max_runtime_seconds=1200))
        ready = await until(handle, lambda s: s.state is JobState.READY)
        await handle.release()
        final = await until(handle, lambda s: s.state.terminal)
        assert_nothing_left(cloud)
    assert ready.team == "ml" and final.state is JobState.COMPLETED


async def test_a_running_job_that_takes_its_team_past_the_budget_is_released_saying_why(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    Teams(sqlite_records.db).create("ml", monthly_budget_usd=100.0, on_exceed="release")
    spend(sqlite_records, "ml", 85.0)
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records, jobs=CHECK_EVERY) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name, team="ml"))
        await until(handle, lambda s: s.state is JobState.READY)
        spend(sqlite_records, "ml", 20.0, job_name="another")  # the team is past it now
        final = await until(handle, lambda s: s.state.terminal)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED
    assert final.ended_because is not None
    assert final.ended_because.startswith("released: team 'ml' passed its monthly budget: 105")
    assert "of 100.00 USD spent this month (on_exceed = release)" in final.ended_because


async def test_with_on_exceed_warn_the_job_goes_on_with_a_warning(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    Teams(sqlite_records.db).create("ml", monthly_budget_usd=100.0, on_exceed="warn")
    spend(sqlite_records, "ml", 85.0)
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records, jobs=CHECK_EVERY) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name, team="ml"))
        await until(handle, lambda s: s.state is JobState.READY)
        spend(sqlite_records, "ml", 20.0, job_name="another")
        warned = await until(handle, lambda s: bool(s.warnings))
        assert warned.state is JobState.READY  # still held
        await handle.release()
        await until(handle, lambda s: s.state.terminal)
        assert_nothing_left(cloud)
    [warning] = warned.warnings
    assert "team 'ml' passed its monthly budget" in warning and warning.endswith("allowed on")


async def test_the_gpu_limit_unknown_teams_and_unknown_secrets_are_refused_naming_them(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    Teams(sqlite_records.db).create("small", max_gpus=8)
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, cloud):
        too_big = await gpuprov.submit(job(f"{job_name[:28]}-gpus", nodes=2, team="small"))
        unknown = await gpuprov.submit(job(f"{job_name[:28]}-team", team="nobody"))
        secret = await gpuprov.submit(
            job(
                f"{job_name[:28]}-secret",
                run="true",
                env={"WANDB_API_KEY": "${{ secrets.WANDB }}"},
            )
        )
        messages = [await failure_of(h) for h in (too_big, unknown, secret)]
        assert creates_by_node(cloud.state) == {}
    assert messages[0] == (
        "refused: team 'small' may hold 8 GPU(s) at once; it holds 0 now, so 8 are left, "
        "and this job needs 16 (2 node(s) x 8)"
    )
    assert messages[1].startswith("team: no team named 'nobody'")
    assert messages[2].startswith(
        "env.WANDB_API_KEY: no secret named 'WANDB' that team 'default' can see"
    )


async def test_a_job_started_with_the_temporal_cli_is_bound_the_same_and_tagged_with_its_team(
    client: Client, task_queue: str, job_name: str, sqlite_records: Records
) -> None:
    Teams(sqlite_records.db).create("ml", monthly_budget_usd=100.0)
    spend(sqlite_records, "ml", 95.0)
    spec = job(job_name, team="ml").model_dump(mode="json")
    address = client.service_client.config.target_host
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, cloud):
        started = await asyncio.create_subprocess_exec(
            temporal_binary(),
            "workflow",
            "start",
            "--address",
            address,
            "--namespace",
            client.namespace,
            "--type",
            contract.PROVISION_JOB,
            "--task-queue",
            task_queue,
            "--workflow-id",
            f"job-{job_name}",
            "--input",
            json.dumps(spec),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(started.communicate(), 60)
        assert started.returncode == 0, stderr.decode()
        handle = gpuprov.job(job_name)
        message = await failure_of(handle)
        assert creates_by_node(cloud.state) == {}

        # No search attribute came with the raw start: the workflow tagged the job itself.
        async def tagged() -> list:
            found = await gpuprov.list(team="ml")
            return [j for j in found if j.name == job_name]

        listed = await eventually(tagged, "the job listed by its GpuprovTeam")
    assert "refused: the monthly budget of team 'ml' is 100.00 USD, 95.00 spent" in message
    assert [j.team for j in listed] == ["ml"]
