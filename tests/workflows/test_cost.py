"""Actual costs of whole jobs on the fake cloud: real dev server, real database.

Running times are whatever the run took, so every assertion recomputes the amount from the row's
own moments (launched, gone) and the cloud's terms, never from a guess at how long it ran."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import select

from gpuprov.config import FaultRule
from gpuprov.engine.worker import open_records
from gpuprov.models import AttemptOutcome, JobState
from gpuprov.store.costs import billed_seconds, cost_report
from gpuprov.store.db import CostRecord, VmRecord
from gpuprov.store.records import Records
from providers.base import Billing
from providers.errors import ErrorKind
from tests.helpers import (
    OFFER_A,
    OFFER_B,
    assert_nothing_left,
    fake_worker,
    fast_cloud,
    job,
    ready_then_release,
    until,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

PER_MINUTE = Billing(granularity_seconds=60, minimum_seconds=60, source="test terms")


@pytest.fixture
def sqlite_records(tmp_path: Path) -> Records:
    return open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")


def rows(records: Records, table) -> list:
    with records.db.session() as session:
        return list(session.exec(select(table)).all())


def assert_actual_is_quote_times_billed_time(vm: VmRecord, actual: CostRecord) -> None:
    assert vm.launched_at is not None and vm.terminated_at is not None
    billed = billed_seconds(vm.terminated_at - vm.launched_at, 60, 60)
    assert actual.billed_seconds == billed and billed % 60 == 0
    assert actual.amount == pytest.approx(vm.price_amount * billed / 3600)
    assert (actual.job, actual.provider, actual.currency, actual.unit) == (
        vm.job,
        "fake",
        "USD",
        "total",
    )
    assert "rounded up per 60 s, minimum 60 s" in actual.source


async def test_a_released_job_has_one_actual_per_machine(client, task_queue, job_name, records):
    """On SQLite and on PostgreSQL (the `records` fixture runs both)."""
    cloud_config = fast_cloud(billing=PER_MINUTE)
    async with fake_worker(client, task_queue, cloud_config, records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name, nodes=2))
        at_ready, final = await ready_then_release(handle)
        assert_nothing_left(cloud)

    assert at_ready.state is JobState.READY and final.state is JobState.COMPLETED
    vms = {vm.vm: vm for vm in rows(records, VmRecord)}
    actuals = {cost.vm: cost for cost in rows(records, CostRecord) if cost.kind == "actual"}
    assert set(actuals) == set(vms) == {node.vm for node in at_ready.nodes}
    for name, vm in vms.items():
        assert (vm.price_amount, vm.price_currency, vm.price_unit) == (10.0, "USD", "hour")
        assert (vm.instance_type, vm.billing_granularity_seconds) == ("gpu8", 60)
        assert vm.created_at <= vm.launched_at <= vm.terminated_at
        assert_actual_is_quote_times_billed_time(vm, actuals[name])

    lines = cost_report(records.db).providers
    [line] = [line for line in lines if line.provider == "fake"]
    assert (line.job, line.machines, line.with_actual) == (job_name, 2, 2)
    # the whole job's hourly estimate (where the workflow names its provider, on that line)
    estimates = [m for line in lines for m in line.estimates]
    assert [(m.amount, m.currency, m.unit) for m in estimates] == [(20.0, "USD", "hour")]
    [total] = line.actual
    assert total.amount == pytest.approx(sum(a.amount for a in actuals.values()))


async def test_a_failed_over_attempts_torn_down_machine_gets_its_actual_too(
    client, task_queue, job_name, records
):
    broken = FaultRule(primitive="create", effect="boot_failed", offer=OFFER_A)
    cloud_config = fast_cloud([broken], billing=PER_MINUTE)
    async with fake_worker(client, task_queue, cloud_config, records) as (gpuprov, cloud):
        at_ready, _ = await ready_then_release(await gpuprov.submit(job(job_name)))
        assert_nothing_left(cloud)

    first, second = at_ready.attempts
    assert (first.offer.id, first.outcome) == (OFFER_A, AttemptOutcome.FAILED)
    assert second.outcome is AttemptOutcome.SUCCEEDED
    vms = {vm.attempt: vm for vm in rows(records, VmRecord)}
    actuals = {cost.vm: cost for cost in rows(records, CostRecord) if cost.kind == "actual"}
    assert sorted(vms) == [1, 2] and set(actuals) == {vm.vm for vm in vms.values()}
    for vm in vms.values():
        assert_actual_is_quote_times_billed_time(vm, actuals[vm.vm])

    machines = cost_report(records.db, job_name).machines
    assert [(m.attempt, m.status, m.billed_seconds) for m in machines] == [
        (1, "terminated", actuals[vms[1].vm].billed_seconds),
        (2, "terminated", actuals[vms[2].vm].billed_seconds),
    ]


async def test_a_machine_whose_create_answer_was_lost_is_billed_from_the_create_request(
    client, task_queue, job_name, sqlite_records
):
    """The create landed but failed without retry: no launch time, yet teardown found and
    deleted the machine, so it is counted from the moment its create was requested."""
    lost = FaultRule(
        primitive="create", effect="lost_response", kind=ErrorKind.FAILED, offer=OFFER_A, times=1
    )
    async with fake_worker(client, task_queue, fast_cloud([lost]), sqlite_records) as (
        gpuprov,
        cloud,
    ):
        at_ready, _ = await ready_then_release(await gpuprov.submit(job(job_name)))
        assert_nothing_left(cloud)

    assert [a.offer.id for a in at_ready.attempts] == [OFFER_A, OFFER_B]
    first = next(vm for vm in rows(sqlite_records, VmRecord) if vm.attempt == 1)
    assert first.launched_at is None and first.terminated_at is not None
    [actual] = [c for c in rows(sqlite_records, CostRecord) if c.vm == first.vm]
    assert actual.billed_seconds == billed_seconds(first.terminated_at - first.created_at, None, 0)
    assert "launch unconfirmed, counted from the create request" in actual.source
    assert "exact seconds: the cloud documents no billing granularity" in actual.source


async def test_a_kept_machine_gets_no_actual_and_unpriced_machines_are_named(
    client, task_queue, job_name, sqlite_records
):
    priced = fast_cloud().instance_types
    unpriced = fast_cloud(instance_types=[t.model_copy(update={"price": None}) for t in priced])
    async with fake_worker(client, task_queue, unpriced, sqlite_records) as (gpuprov, _cloud):
        handle = await gpuprov.submit(job(f"{job_name}-free"))
        await ready_then_release(handle)
    async with fake_worker(client, task_queue, fast_cloud(), sqlite_records) as (gpuprov, _cloud):
        handle = await gpuprov.submit(job(f"{job_name}-kept", release="keep"))
        await until(handle, lambda s: s.state is JobState.READY)
        await handle.release()
        await handle.result()

    assert [c for c in rows(sqlite_records, CostRecord) if c.kind == "actual"] == []
    report = cost_report(sqlite_records.db)
    lines = {line.job: line for line in report.providers if line.provider == "fake"}
    assert len(lines[f"{job_name}-free"].unpriced) == 1
    free_estimates = [
        m for line in report.providers if line.job == f"{job_name}-free" for m in line.estimates
    ]
    assert free_estimates == []  # an unpriced offer records no estimate
    kept = lines[f"{job_name}-kept"]
    assert len(kept.kept) == 1 and kept.actual == [] and kept.unpriced == []
    [machine] = cost_report(sqlite_records.db, f"{job_name}-kept").machines
    assert machine.status == "kept" and machine.note.startswith("kept (release: keep)")
