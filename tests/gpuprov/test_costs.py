"""Actual costs on a real database: every test runs on SQLite and on PostgreSQL 15 (conftest).

A machine's clocks are set on its row before its termination is confirmed: `vm_terminated`
keeps a terminated_at that is already there, so running times are exact, never measured."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from gpuprov.store.costs import billed_seconds, cost_report
from gpuprov.store.db import CostRecord, Database, VmRecord
from gpuprov.store.records import Records
from providers import CLOUDS
from providers.base import Billing, PriceQuote
from tests.gpuprov.test_records import race

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

T0 = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
PER_SECOND = 0.001  # of a 3.6/hour quote


def quote(amount: float = 3.6, currency: str = "USD", unit: str = "hour") -> PriceQuote:
    return PriceQuote(
        amount=amount, currency=currency, unit=unit, source="test catalogue", observed_at=T0
    )


def billing_of(cloud: str) -> Billing:
    """The terms a cloud's adapter reports (`BILLING` beside its adapter in the registry)."""
    module = CLOUDS[cloud].adapter.split(":")[0]
    return importlib.import_module(module).BILLING


def machine(
    records: Records,
    vm: str,
    *,
    price: PriceQuote | None = None,
    billing: Billing | None = None,
    job: str = "train",
    provider: str = "fake",
    attempt: int = 1,
) -> None:
    records.record_vm(
        job=job,
        node_index=0,
        attempt=attempt,
        vm=vm,
        provider=provider,
        region="r1",
        zone="r1-a",
        instance_type="gpu8",
        price=price,
        billing=billing,
    )


def clocks(database: Database, vm: str, **moments: datetime | None) -> None:
    with database.engine.begin() as connection:
        connection.execute(sa.update(VmRecord).where(VmRecord.vm == vm).values(**moments))


def ran_then_gone(records: Records, database: Database, vm: str, ran: timedelta, **kw: Any):
    """A machine launched at T0 and confirmed gone `ran` later; its actual records, if any."""
    machine(records, vm, **kw)
    records.set_vm_instances(vm, ["i-1"], "created")
    clocks(database, vm, launched_at=T0, terminated_at=T0 + ran)
    records.vm_terminated(vm, ["i-1"])
    return actuals(records, kw.get("job", "train"))


def actuals(records: Records, job: str = "train") -> list[CostRecord]:
    return [cost for cost in records.costs(job) if cost.kind == "actual"]


# ---------------------------------------------------------------------------- billed time


@pytest.mark.parametrize(
    ("granularity", "minimum", "ran", "billed"),
    [
        (60, 0, timedelta(seconds=120), 120),  # whole minutes stay whole
        (60, 0, timedelta(seconds=120, microseconds=1), 180),  # a started minute is billed
        (60, 0, timedelta(milliseconds=300), 60),
        (1, 60, timedelta(seconds=5), 60),  # the minimum
        (1, 60, timedelta(seconds=61, milliseconds=200), 62),
        (None, 0, timedelta(seconds=61, microseconds=234567), 61.234567),  # exact
        (None, 60, timedelta(seconds=5), 60),
        (1, 0, timedelta(seconds=-3), 0),  # clocks that disagree bill nothing, never less
    ],
)
def test_billed_seconds_round_up_to_the_granularity_then_the_minimum(
    granularity, minimum, ran, billed
):
    assert billed_seconds(ran, granularity, minimum) == billed


@pytest.mark.parametrize(
    ("cloud", "ran", "billed"),
    [
        ("lambda", timedelta(seconds=1), 60),  # one-minute increments
        ("lambda", timedelta(seconds=61), 120),
        ("runpod", timedelta(seconds=61, milliseconds=1), 62),  # per second
        ("vast", timedelta(milliseconds=400), 1),
        ("aws", timedelta(seconds=30), 60),  # per second, at least 60 s
        ("aws", timedelta(seconds=90, milliseconds=1), 91),
        ("gce", timedelta(seconds=59), 60),  # at least a minute, then per second
        ("gce", timedelta(minutes=10, milliseconds=500), 601),
        ("prime", timedelta(seconds=75, microseconds=5), 75.000005),  # undocumented: exact
        ("ssh", timedelta(seconds=2), 2),
    ],
)
def test_an_actual_is_the_quote_times_the_time_billed_on_each_clouds_terms(
    records: Records, database: Database, cloud: str, ran: timedelta, billed: float
):
    [actual] = ran_then_gone(
        records, database, "vm-1", ran, price=quote(), billing=billing_of(cloud)
    )

    assert actual.billed_seconds == billed
    assert actual.amount == pytest.approx(billed * PER_SECOND)
    assert (actual.currency, actual.unit, actual.vm, actual.provider) == (
        "USD",
        "total",
        "vm-1",
        "fake",
    )
    assert actual.recorded_at == T0 + ran  # the gone moment
    assert actual.source.startswith("3.6 USD/hour (test catalogue) x ")
    terms = billing_of(cloud)
    if terms.granularity_seconds is None:
        assert "exact seconds: the cloud documents no billing granularity" in actual.source
    else:
        assert f"rounded up per {terms.granularity_seconds:g} s" in actual.source


def test_a_quote_per_minute_is_converted_and_a_unit_of_no_time_records_nothing(
    records: Records, database: Database
):
    [per_minute] = ran_then_gone(
        records, database, "vm-m", timedelta(minutes=2), price=quote(0.06, unit="minute")
    )
    assert per_minute.amount == pytest.approx(0.12)

    before = len(actuals(records))
    ran_then_gone(records, database, "vm-g", timedelta(minutes=2), price=quote(unit="GB"))
    assert len(actuals(records)) == before
    [row] = [m for m in cost_report(records.db, "train").machines if m.vm == "vm-g"]
    assert "not a unit of time" in row.note and row.amount is None


# ---------------------------------------------------------------------------- once, or not at all


def test_one_actual_per_machine_however_often_it_is_confirmed_gone(
    records: Records, database: Database
):
    ran_then_gone(records, database, "vm-1", timedelta(minutes=3), price=quote())
    records.vm_terminated("vm-1")
    records.vm_terminated("vm-1", ["i-1"])
    records.set_vm_status("vm-1", "terminated")

    [actual] = actuals(records)
    assert actual.billed_seconds == 180


def test_machines_confirmed_gone_at_once_by_many_callers_get_one_actual(
    records: Records, database: Database
):
    machine(records, "vm-1", price=quote())
    records.set_vm_instances("vm-1", ["i-1"], "created")
    clocks(database, "vm-1", launched_at=T0, terminated_at=T0 + timedelta(minutes=1))

    results = race(6, lambda _: records.vm_terminated("vm-1"))

    assert results == [None] * 6
    assert [a.billed_seconds for a in actuals(records)] == [60]


def test_the_database_refuses_a_second_actual_for_a_machine(records: Records):
    first = dict(job="t", kind="actual", amount=1.0, currency="USD", unit="total", source="s")
    with records.db.session() as session:
        session.add(CostRecord(**first, recorded_at=T0, vm="vm-1"))
        session.commit()
    with pytest.raises(sa.exc.IntegrityError), records.db.session() as session:
        session.add(CostRecord(**first, recorded_at=T0, vm="vm-1"))
        session.commit()
    # estimates carry no machine, and one machine may have many other records
    records.record_cost(job="t", kind="estimate", amount=2, currency="USD", unit="hour", source="x")
    records.record_cost(job="t", kind="estimate", amount=2, currency="USD", unit="hour", source="x")


def test_no_quote_no_actual_and_the_report_names_the_machine(records: Records, database: Database):
    assert ran_then_gone(records, database, "vm-free", timedelta(hours=1), price=None) == []

    report = cost_report(records.db)
    [line] = report.providers
    assert (line.job, line.provider, line.unpriced, line.actual) == (
        "train",
        "fake",
        ["vm-free"],
        [],
    )
    [row] = cost_report(records.db, "train").machines
    assert row.quote is None and row.amount is None
    assert row.note == "no quote: no actual cost can be computed"


def test_a_machine_never_launched_costs_nothing_and_is_not_called_unpriced(records: Records):
    machine(records, "vm-stockout", price=quote())
    records.vm_terminated("vm-stockout")  # the create failed: teardown found nothing
    machine(records, "vm-unpriced-stockout", price=None)
    records.vm_terminated("vm-unpriced-stockout")

    assert actuals(records) == []
    [line] = cost_report(records.db).providers
    assert line.unpriced == [] and line.machines == 2
    notes = {row.vm: row.note for row in cost_report(records.db, "train").machines}
    assert notes["vm-stockout"] == "never launched (the create did not succeed): nothing to bill"


def test_a_lost_create_answer_is_counted_from_the_create_request(
    records: Records, database: Database
):
    """The create's answer was lost (no launch time), but teardown found and deleted the
    machine: it ran, at most since the create was requested."""
    machine(records, "vm-lost", price=quote(), billing=billing_of("runpod"))
    clocks(database, "vm-lost", created_at=T0, terminated_at=T0 + timedelta(seconds=30))
    records.vm_terminated("vm-lost", ["pod-9"])

    [actual] = actuals(records)
    assert actual.billed_seconds == 30 and actual.amount == pytest.approx(0.03)
    assert "launch unconfirmed, counted from the create request" in actual.source


def test_a_kept_machine_has_no_actual_and_the_report_says_it_still_runs(
    records: Records, database: Database
):
    machine(records, "vm-kept", price=quote())
    records.set_vm_instances("vm-kept", ["i-1"], "created")
    records.set_vm_status("vm-kept", "kept")
    machine(records, "vm-up", price=quote())
    records.set_vm_instances("vm-up", ["i-2"], "created")

    assert actuals(records) == []
    [line] = cost_report(records.db).providers
    assert (line.kept, line.not_gone) == (["vm-kept"], ["vm-up"])
    notes = {row.vm: row.note for row in cost_report(records.db, "train").machines}
    assert notes["vm-kept"].startswith("kept (release: keep): still running")
    assert notes["vm-up"] == "created: not confirmed gone yet, so no actual yet"


def test_launched_at_is_stamped_once_when_the_cloud_accepts_the_create(records: Records):
    machine(records, "vm-1", price=quote())
    assert records.get_vm("vm-1").launched_at is None  # recorded before the create call

    records.set_vm_instances("vm-1", ["i-1"], "created")
    launched = records.get_vm("vm-1").launched_at
    records.set_vm_instances("vm-1", ["i-1"], "created")  # a retry that adopts it again

    assert launched is not None and records.get_vm("vm-1").launched_at == launched
    assert launched >= records.get_vm("vm-1").created_at


# ---------------------------------------------------------------------------- the report


def test_currencies_are_summed_apart_and_never_added_together(records: Records, database: Database):
    ran = timedelta(hours=1)
    ran_then_gone(records, database, "vm-usd-1", ran, price=quote(2.0))
    ran_then_gone(records, database, "vm-usd-2", ran, price=quote(3.0))
    ran_then_gone(records, database, "vm-eur", ran, price=quote(4.0, currency="EUR"))

    [line] = cost_report(records.db).providers
    assert [(m.currency, m.amount, m.unit) for m in line.actual] == [
        ("EUR", pytest.approx(4.0), "total"),
        ("USD", pytest.approx(5.0), "total"),
    ]
    assert line.with_actual == 3


def test_the_report_shows_each_jobs_estimates_and_actuals_per_provider(
    records: Records, database: Database
):
    for amount, provider in ((24.0, "fake"), (20.0, "fake"), (24.0, "fake"), (30.0, "aws")):
        records.record_cost(
            job="train",
            kind="estimate",
            amount=amount,
            currency="USD",
            unit="hour",
            source="x",
            provider=provider,
        )
    records.record_cost(
        job="old", kind="estimate", amount=1.0, currency="USD", unit="hour", source="x"
    )
    ran_then_gone(records, database, "vm-1", timedelta(hours=2), price=quote(10.0))
    ran_then_gone(
        records, database, "vm-2", timedelta(hours=1), price=quote(15.0), provider="aws", attempt=2
    )

    report = cost_report(records.db)
    lines = {(line.job, line.provider): line for line in report.providers}
    assert list(lines) == [("old", None), ("train", "aws"), ("train", "fake")]
    assert [m.amount for m in lines[("train", "fake")].estimates] == [20.0, 24.0]
    assert [m.amount for m in lines[("train", "fake")].actual] == [pytest.approx(20.0)]
    assert [m.amount for m in lines[("train", "aws")].actual] == [pytest.approx(15.0)]
    assert lines[("old", None)].actual == [] and lines[("old", None)].machines == 0
    assert report.machines == []  # only with a job

    one = cost_report(records.db, "train")
    assert {line.job for line in one.providers} == {"train"}
    assert [(m.vm, m.provider, m.billed_seconds) for m in one.machines] == [
        ("vm-1", "fake", 7200),
        ("vm-2", "aws", 3600),
    ]
    first = one.machines[0]
    assert (first.region, first.zone, first.instance_type) == ("r1", "r1-a", "gpu8")
    assert (first.launched_at, first.gone_at) == (T0, T0 + timedelta(hours=2))
    assert first.quote is not None and first.quote.amount == 10.0
    assert cost_report(records.db, "no-such-job").providers == []
