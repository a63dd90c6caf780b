"""`gpuprov end` and the stuck machines `gpuprov orphans` shows, on the real dev server, the fake
cloud and a SQLite database shared by the worker and the CLI.

A job is made stuck the way a bad deploy makes one: it reaches ready on today's code, then a
worker whose ProvisionJob changed without a `workflow.patched` gate replays it, and every
workflow task fails with a nondeterminism error (docs/architecture.md, "Changing workflow code
safely"). Such a job keeps its machine, a cancel never reaches its code, and the reconciler
leaves the machine alone (owner unknown); `gpuprov end` terminates it and deletes the machine.
"""

from __future__ import annotations

import asyncio
import io
import os
import pty
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import RawValue

from gpuprov.cli import main as cli
from gpuprov.contract import ReconcileInput, ReconcileReport
from gpuprov.engine.worker import WORKFLOWS, build_worker, open_records
from gpuprov.models import JobState, JobStatus
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from providers.base import InstanceSpec, ResourceRequest
from providers.fake import FakeCloud
from tests.helpers import assert_nothing_left, fast_cloud, job, until
from workflows.intake import NO_INPUT
from workflows.job import ProvisionJob
from workflows.reconcile import Reconcile

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@workflow.defn(name="ProvisionJob")
class ProvisionJobChangedWithoutGate(ProvisionJob):
    """A deploy that added one command (a timer) at the start of every job without a gate: a
    job started on today's code fails every workflow task on replay."""

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> JobStatus:
        await workflow.sleep(0.1)
        return await super().run(raw)


@dataclass
class Setup:
    """One test's worker-side pieces and the CLI's settings (through the environment)."""

    client: Client
    task_queue: str
    address: str
    records: Records
    cloud: FakeCloud


@pytest.fixture
def setup(
    client: Client, task_queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Setup]:
    database_url = f"sqlite:///{tmp_path / 'gpuprov.db'}"
    monkeypatch.delenv("GPUPROV_CONFIG", raising=False)
    monkeypatch.setenv("GPUPROV_DATABASE__URL", database_url)
    monkeypatch.setenv("GPUPROV_TEMPORAL__TASK_QUEUE", task_queue)
    records = open_records(database_url)
    address = client.service_client.config.target_host
    yield Setup(client, task_queue, address, records, FakeCloud(fast_cloud()))
    records.db.dispose()


@pytest.fixture
async def cloud_closed(setup: Setup) -> AsyncIterator[None]:
    yield
    await setup.cloud.aclose()


@asynccontextmanager
async def worker(setup: Setup, job_class: type = ProvisionJob) -> AsyncIterator[GpuprovClient]:
    # Unsandboxed: the sandbox would re-import this test module to validate the class above.
    others = [cls for cls in WORKFLOWS if cls is not ProvisionJob]
    running = build_worker(
        setup.client, setup.task_queue, {"fake": setup.cloud}, setup.records,
        api_url="http://127.0.0.1:9", workflows=[job_class, *others], sandboxed=False,
    )  # fmt: skip
    async with running:
        yield GpuprovClient(setup.client, setup.task_queue)


async def gpuprov(setup: Setup, *argv: str) -> int:
    """The `gpuprov` command line, run as a user runs it (its own event loop and client)."""
    return await asyncio.to_thread(cli.main, ["--address", setup.address, *argv])


async def ready_vm(gpuprov_client: GpuprovClient, name: str) -> str:
    status = await until(
        await gpuprov_client.submit(job(name)), lambda s: s.state is JobState.READY
    )
    [node] = status.nodes
    return node.vm


async def until_stuck(client: Client, name: str, timeout: float = 60) -> int:
    """Wait until the job's pending workflow task has failed at least once (attempt > 1)."""
    handle = client.get_workflow_handle(f"job-{name}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        description = await handle.describe()
        attempt = description.raw_description.pending_workflow_task.attempt
        if attempt > 1:
            return attempt
        assert loop.time() < deadline, f"job-{name} never failed a workflow task"
        await asyncio.sleep(0.2)


async def until_no_instance(cloud: FakeCloud, timeout: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while cloud.live_instances():
        assert loop.time() < deadline, "the deleted instance never went"
        await asyncio.sleep(0.05)


async def termination_reason(client: Client, name: str) -> str:
    history = await client.get_workflow_handle(f"job-{name}").fetch_history()
    [ended] = [
        event
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED
    ]
    return ended.workflow_execution_terminated_event_attributes.reason


async def workflow_status(client: Client, name: str) -> WorkflowExecutionStatus | None:
    return (await client.get_workflow_handle(f"job-{name}").describe()).status


async def test_a_stuck_job_is_listed_then_end_terminates_it_and_deletes_its_machine(
    setup: Setup, cloud_closed: None, job_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with worker(setup) as on_todays_code:
        vm = await ready_vm(on_todays_code, job_name)
    async with worker(setup, ProvisionJobChangedWithoutGate) as after_bad_deploy:
        await after_bad_deploy.job(job_name).cancel()  # accepted, but never reaches the code
        await until_stuck(setup.client, job_name)

        # The reconciler never deletes on doubt: the machine stays, the owner is unknown.
        scheduled = await setup.client.execute_workflow(
            Reconcile.run,
            ReconcileInput(grace_seconds=0),
            id=f"reconcile-{uuid.uuid4().hex[:12]}",
            task_queue=setup.task_queue,
            execution_timeout=timedelta(minutes=2),
        )
        assert isinstance(scheduled, ReconcileReport)
        assert (scheduled.deleted, scheduled.still_open) == (0, 1), scheduled
        assert scheduled.left_open == [f"{vm}: owner unknown (job stuck)"]
        assert [row.vm for row in setup.cloud.live_instances()] == [vm]

        assert await gpuprov(setup, "orphans") == 0
        listed = capsys.readouterr().out
        assert "no open orphans" in listed
        assert f"job {job_name}: job stuck: its workflow task keeps failing (attempt " in listed
        assert "[TMPRL1100] Nondeterminism" in listed
        assert f"end it with `gpuprov end {job_name}`" in listed
        assert f"fake/r1 {vm} [" in listed and "]: running (recorded " in listed

        code = await gpuprov(setup, "end", job_name, "--yes", "--reason", "bad deploy")
        ended = capsys.readouterr().out
        assert code == 0, ended
        assert ended.splitlines() == [
            f"job {job_name}: workflow terminated",
            f"    deleted, confirmed gone: {vm}",
            f"nothing of job {job_name} is left live",
        ]
        assert_nothing_left(setup.cloud)
        assert await workflow_status(setup.client, job_name) is WorkflowExecutionStatus.TERMINATED
        assert await termination_reason(setup.client, job_name) == "bad deploy"
        row = setup.records.get_vm(vm)
        assert row is not None and row.status == "terminated"
        [orphan] = setup.records.orphans(include_resolved=True)
        assert orphan.vm == vm and orphan.resolved_at is not None
        assert setup.records.open_orphans() == []

        # Idempotent: a second run sweeps again and finds nothing to do.
        assert await gpuprov(setup, "end", job_name, "--yes") == 0
        again = capsys.readouterr().out
        assert again.splitlines() == [
            f"job {job_name}: workflow had ended: terminated",
            f"nothing of job {job_name} is left live",
        ]
        assert await gpuprov(setup, "orphans") == 0
        assert "no machines whose job is stuck or whose owner is unknown" in capsys.readouterr().out
    assert len(setup.records.orphans(include_resolved=True)) == 1


@pytest.mark.parametrize("release", ["terminate_on_completion", "keep"])
async def test_end_on_a_job_that_ended_cleanly_changes_nothing(
    setup: Setup,
    cloud_closed: None,
    job_name: str,
    release: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Also when the job kept its machine on purpose: kept machines are never touched."""
    async with worker(setup) as gpuprov_client:
        handle = await gpuprov_client.submit(job(job_name, release=release))
        [node] = (await until(handle, lambda s: s.state is JobState.READY)).nodes
        await handle.release()
        assert (await handle.result()).state is JobState.COMPLETED
        before = setup.records.get_vm(node.vm)
        live = setup.cloud.live_instances()
        creates = setup.cloud.state.creates_per_vm()

        assert await gpuprov(setup, "end", job_name, "--yes") == 0

        kept = [f"    kept on purpose (release: keep), not touched: {node.vm}"]
        assert capsys.readouterr().out.splitlines() == [
            f"job {job_name}: workflow had ended: completed",
            *(kept if release == "keep" else []),
            f"nothing of job {job_name} is left live",
        ]
    assert await workflow_status(setup.client, job_name) is WorkflowExecutionStatus.COMPLETED
    assert setup.records.get_vm(node.vm) == before
    assert setup.records.orphans(include_resolved=True) == []
    assert setup.cloud.live_instances() == live
    assert len(live) == (1 if release == "keep" else 0)
    assert setup.cloud.state.creates_per_vm() == creates


async def test_end_closes_the_row_of_a_machine_that_is_already_gone(
    setup: Setup, cloud_closed: None, job_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its machine was deleted behind the job's back: the row still says running and its side
    resources are still there. The pass confirms it gone, cleans up and closes the row."""
    async with worker(setup) as gpuprov_client:
        handle = await gpuprov_client.submit(job(job_name))
        [node] = (await until(handle, lambda s: s.state is JobState.READY)).nodes
        await setup.cloud.delete(node.location, node.vm, node.instance_ids)
        await until_no_instance(setup.cloud)
        assert len(setup.cloud.state.live_side_resources()) == 1

        assert await gpuprov(setup, "end", job_name, "--yes") == 0

        assert capsys.readouterr().out.splitlines() == [
            f"job {job_name}: workflow terminated",
            f"    already gone, record closed: {node.vm}",
            f"nothing of job {job_name} is left live",
        ]
    assert_nothing_left(setup.cloud)
    row = setup.records.get_vm(node.vm)
    assert row is not None and row.status == "terminated"
    [orphan] = setup.records.orphans(include_resolved=True)
    assert orphan.resolved_at is not None and "the cloud shows nothing" in orphan.last_error


async def plant_ownerless(setup: Setup, job_name: str) -> str:
    """A machine recorded for a job that has no workflow: an orphan any full pass deletes."""
    vm = f"{job_name}-a1-n0-0ddba11"
    setup.records.record_vm(
        job=job_name, node_index=0, attempt=1, vm=vm, provider="fake", region="r1", zone=None
    )
    [offer, *_] = await setup.cloud.plan(ResourceRequest())
    spec = InstanceSpec(vm=vm, job=job_name, node_index=0, attempt=1)
    await setup.cloud.create(offer, await setup.cloud.prepare(offer, spec), spec)
    return vm


async def test_the_pass_of_end_touches_no_other_jobs_machine(
    setup: Setup, cloud_closed: None, job_name: str
) -> None:
    """Ending one job leaves alone another job's live machine (its name starts with the ended
    job's name) and a machine that any full pass would delete, but that belongs to a third job."""
    second = f"{job_name}-2"
    async with worker(setup) as gpuprov_client:
        vm = await ready_vm(gpuprov_client, job_name)
        second_vm = await ready_vm(gpuprov_client, second)
        ownerless = await plant_ownerless(setup, f"{job_name}-gone")

        report = await gpuprov_client.end_job(job_name, reason="test")

        assert report.terminated and report.workflow == "terminated"
        assert report.deleted_vms == [vm] and report.nothing_left, report
        assert (report.found, report.deleted, report.resolved) == (1, 1, 1)
        live = sorted(row.vm for row in setup.cloud.live_instances())
        assert live == sorted([second_vm, ownerless])
        second_status = await gpuprov_client.job(second).status()
        assert second_status.state is JobState.READY
        assert [node.vm for node in second_status.live_nodes()] == [second_vm]
        for kept in (second_vm, ownerless):
            row = setup.records.get_vm(kept)
            assert row is not None and row.status != "terminated"
        assert [orphan.vm for orphan in setup.records.orphans(include_resolved=True)] == [vm]
        await gpuprov_client.job(second).release()
        assert (await gpuprov_client.job(second).result()).state is JobState.COMPLETED


async def test_end_without_yes_asks_on_a_terminal_and_refuses_without_one(
    setup: Setup,
    cloud_closed: None,
    job_name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with worker(setup) as gpuprov_client:
        vm = await ready_vm(gpuprov_client, job_name)

        def unchanged() -> None:
            assert [row.vm for row in setup.cloud.live_instances()] == [vm]
            row = setup.records.get_vm(vm)
            assert row is not None and row.status == "running"
            assert setup.records.orphans(include_resolved=True) == []

        # Not a terminal: refused at once, even with "y" waiting on stdin.
        monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
        assert await gpuprov(setup, "end", job_name) == 2
        refused = capsys.readouterr()
        assert refused.err.splitlines() == [
            f"error: not ending job {job_name!r}: stdin is not a terminal to confirm on; pass --yes"
        ]
        unchanged()
        assert await workflow_status(setup.client, job_name) is WorkflowExecutionStatus.RUNNING

        # A terminal: the job and its machines are shown; anything but yes ends nothing.
        assert await answered(setup, monkeypatch, job_name, "n\n") == 2
        declined = capsys.readouterr()
        assert f"job {job_name} is running" in declined.out
        assert f"`gpuprov cancel {job_name}` ends it with its own teardown" in declined.out
        assert f"    fake/r1 {vm}: running" in declined.out
        assert declined.err.splitlines() == [f"error: job {job_name!r} not ended: not confirmed"]
        unchanged()
        assert (await gpuprov_client.job(job_name).status()).state is JobState.READY
        assert await gpuprov(setup, "orphans") == 0  # a job that holds its machine: not listed
        assert "no machines whose job is stuck" in capsys.readouterr().out

        assert await answered(setup, monkeypatch, job_name, "yes\n") == 0
        assert f"deleted, confirmed gone: {vm}" in capsys.readouterr().out
        assert_nothing_left(setup.cloud)


async def answered(
    setup: Setup, monkeypatch: pytest.MonkeyPatch, job_name: str, answer: str
) -> int:
    """`gpuprov end JOB` on a terminal (a pseudo-terminal) that answers `answer`."""
    controller, terminal = pty.openpty()
    try:
        os.write(controller, answer.encode())
        with os.fdopen(os.dup(terminal), "r") as stdin:
            monkeypatch.setattr("sys.stdin", stdin)
            return await gpuprov(setup, "end", job_name)
    finally:
        os.close(controller)
        os.close(terminal)


def test_orphans_says_why_a_jobs_machines_are_not_looked_after(
    temporal_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A job with no workflow has ended: the reconciler deletes its machine after the grace
    period. When Temporal cannot be reached, every owner is unknown."""
    address = temporal_env.client.service_client.config.target_host
    database_url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.delenv("GPUPROV_CONFIG", raising=False)
    monkeypatch.setenv("GPUPROV_DATABASE__URL", database_url)
    name = f"never-started-{uuid.uuid4().hex[:8]}"
    records = open_records(database_url)
    try:
        records.record_vm(
            job=name, node_index=0, attempt=1, vm=f"{name}-a1-n0-abcdef", provider="fake",
            region="r1", zone=None,
        )  # fmt: skip
        records.record_vm(
            job="kept-job", node_index=0, attempt=1, vm="kept-job-a1-n0-abcdef", provider="fake",
            region="r1", zone=None,
        )  # fmt: skip
        records.set_vm_status("kept-job-a1-n0-abcdef", "kept")
    finally:
        records.db.dispose()

    assert cli.main(["--address", address, "orphans"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[1:] == [
        "machines whose job is stuck or whose owner is unknown:",
        f"job {name}: job ended (no such workflow): the reconciler deletes it after the "
        "grace period",
        listed[3],
    ]
    assert listed[3].startswith(f"    fake/r1 {name}-a1-n0-abcdef [no ids]: recorded (recorded ")

    assert cli.main(["--address", "127.0.0.1:1", "orphans"]) == 0
    unreachable = capsys.readouterr().out.splitlines()
    assert unreachable[2].startswith(
        f"job {name}: owner unknown: cannot reach Temporal at 127.0.0.1:1"
    )
    assert "kept-job" not in "\n".join(unreachable)
