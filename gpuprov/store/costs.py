"""Actual cost: what one machine cost from launch to gone, and the report behind `gpuprov cost`.

A VM row keeps its offer's quote (amount, currency, unit, source), the cloud's documented billing
terms (`Capabilities.billing`) and `launched_at`, the moment gpuprov learned that the cloud had
accepted the create. When the machine is confirmed gone (`Records.vm_terminated`, whose stamp is
`terminated_at`), `record_actual` writes its `actual` cost record in the same transaction:

    running = terminated_at - launched_at
    billed  = running rounded up to the billing granularity, and at least the minimum;
              the exact running time where the cloud documents no granularity
    amount  = quote per second x billed seconds

Both moments are gpuprov's own clock: the cloud may start billing later (at boot or health
checks) and stops before gpuprov sees the machine gone, so an actual is gpuprov's account of
the machine's run, not the cloud's invoice. No quote, no record: a price is never invented. A
kept machine (release: keep) is still running and gets none. One actual per machine, however
often its termination is confirmed: a partial unique index on cost_records(vm) for actuals, and
an INSERT that does nothing when one is there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from pydantic import Field
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from gpuprov.models import DEFAULT_TEAM, TeamSpend
from gpuprov.store.db import CostRecord, Database, JobRun, VmRecord, new_id
from gpuprov.store.runs import pick_run, runs_of
from providers.base import Model

# The quote units an actual can be computed from; any other unit records nothing.
UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
ACTUAL_UNIT = "total"  # an actual's amount is what the machine cost in all
_MICROSECOND = timedelta(microseconds=1)
_ACTUAL = sa.text("kind = 'actual'")  # the partial unique index's predicate, verbatim


# ---------------------------------------------------------------------------- computing an actual


@dataclass(frozen=True)
class Actual:
    amount: float
    currency: str
    billed_seconds: float
    source: str


def billed_seconds(running: timedelta, granularity: float | None, minimum: float | None) -> float:
    """The running time as billed: rounded up to whole increments of `granularity` seconds (none:
    the exact time, to the microsecond), then at least `minimum` seconds. Integer microseconds,
    so 120 s at a 60 s granularity is two increments, never three."""
    exact = max(0, running // _MICROSECOND)
    if granularity:
        step = max(1, round(granularity * 1_000_000))
        exact = -(-exact // step) * step
    return max(exact / 1_000_000, minimum or 0.0)


def billing_basis(granularity: float | None, minimum: float | None) -> str:
    """The terms in words, for a record's source: "rounded up per 1 s, minimum 60 s", or
    "exact seconds: ..." where the cloud documents no granularity."""
    if granularity:
        basis = f"rounded up per {granularity:g} s"
    else:
        basis = "exact seconds: the cloud documents no billing granularity"
    if minimum:
        basis += f", minimum {minimum:g} s"
    return basis


def actual_or_reason(row: VmRecord, seen_ids: Sequence[str] = ()) -> Actual | str:
    """The actual cost of a gone machine, or why there is none (in words for `gpuprov cost`).

    The start is `launched_at`. A row without it whose machine was seen all the same (its ids
    known, or found and deleted by teardown: the create's answer was lost) is counted from
    `created_at`, the create request, which the machine cannot predate; the source says so."""
    if row.status == "kept":
        return "kept (release: keep): still running, so no actual; gpuprov does not see it stop"
    if row.price_amount is None or row.price_currency is None or row.price_unit is None:
        return "no quote: no actual cost can be computed"
    if row.terminated_at is None:
        return f"{row.status}: not confirmed gone yet, so no actual yet"
    unit_seconds = UNIT_SECONDS.get(row.price_unit)
    if unit_seconds is None:
        return f"quote per {row.price_unit!r}: not a unit of time gpuprov converts, no actual"
    start, started = row.launched_at, "launched"
    if start is None:
        if not (seen_ids or row.instance_ids):
            return "never launched (the create did not succeed): nothing to bill"
        start, started = row.created_at, "launch unconfirmed, counted from the create request"
    granularity, minimum = row.billing_granularity_seconds, row.billing_minimum_seconds
    billed = billed_seconds(row.terminated_at - start, granularity, minimum)
    quote = f"{row.price_amount:g} {row.price_currency}/{row.price_unit} ({row.price_source})"
    terms = billing_basis(granularity, minimum)
    source = f"{quote} x {billed:.10g} s billed ({terms}), {started} to gone"
    return Actual(
        amount=row.price_amount * billed / unit_seconds,
        currency=row.price_currency,
        billed_seconds=billed,
        source=source,
    )


def record_actual(session: Session, vm: str, seen_ids: Sequence[str] = ()) -> None:
    """Inside the caller's transaction, after the row says terminated: the machine's actual,
    unless it has none or already has one."""
    row = session.exec(
        select(VmRecord).where(VmRecord.vm == vm).execution_options(populate_existing=True)
    ).first()
    if row is None:
        return
    actual = actual_or_reason(row, seen_ids)
    if not isinstance(actual, Actual):
        return
    values = {
        "id": new_id(),
        "job": row.job,
        "run": row.run,
        "kind": "actual",
        "amount": actual.amount,
        "currency": actual.currency,
        "unit": ACTUAL_UNIT,
        "source": actual.source,
        "recorded_at": row.terminated_at,
        "provider": row.provider,
        "vm": row.vm,
        "billed_seconds": actual.billed_seconds,
    }
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    insert = dialect.insert(CostRecord).values(values)
    session.exec(insert.on_conflict_do_nothing(index_elements=["vm"], index_where=_ACTUAL))


# ---------------------------------------------------------------------------- the report


class Money(Model):
    amount: float
    currency: str
    unit: str  # "hour": a rate; "total": what was spent


class Quote(Model):
    amount: float
    currency: str
    unit: str
    source: str | None = None


class ProviderCost(Model):
    """One job on one provider: the hourly estimates of its attempts there and what its gone
    machines cost, per currency (amounts in different currencies are never added)."""

    job: str
    provider: str | None  # None: estimates recorded without their provider
    # The distinct whole-job hourly rates recorded for its attempts here, by currency and amount
    # (attempts planned together share a quote time, so recorded order is no order).
    estimates: list[Money] = Field(default_factory=list)
    actual: list[Money] = Field(default_factory=list)  # actual records summed, one per currency
    machines: int = 0  # VM rows
    with_actual: int = 0
    # Machines launched without a quote: no actual can be computed for them.
    unpriced: list[str] = Field(default_factory=list)
    kept: list[str] = Field(default_factory=list)  # release: keep, still running: no actual
    not_gone: list[str] = Field(default_factory=list)  # not confirmed gone yet: no actual yet


class MachineCost(Model):
    """One machine of a job: where, what, its quote, launched and gone, and what it cost."""

    vm: str
    attempt: int
    node_index: int
    provider: str
    region: str
    zone: str | None = None
    instance_type: str | None = None
    status: str
    quote: Quote | None = None
    launched_at: datetime | None = None
    gone_at: datetime | None = None
    billed_seconds: float | None = None
    amount: Money | None = None
    source: str | None = None  # the actual's: quote, billed time, billing terms
    note: str = ""  # why there is no amount


class CostReport(Model):
    job: str | None = None  # the job asked for; None: every job
    team: str | None = None  # the team asked for: its jobs only; None: every team's
    budget: TeamSpend | None = None  # with a team: its month so far, against its budget
    # With a job: the run shown (its latest unless asked for another; "" for rows from before
    # runs were recorded) and every run of the name, oldest first.
    run: str | None = None
    runs: list[str] = Field(default_factory=list)
    providers: list[ProviderCost] = Field(default_factory=list)
    machines: list[MachineCost] = Field(default_factory=list)  # with a job only


def cost_report(
    db: Database, job: str | None = None, run: str | None = None, team: str | None = None
) -> CostReport:
    """Every job (or one) per provider; with a job, also each of its machines: of one run of
    it, `run` or else its latest (RunNotFound for a run the name never had). With a team, only
    its runs (the default team's include the runs from before teams)."""
    chosen = pick_run(db, job, run) if job is not None else None
    with db.session() as session:
        cost_query = select(CostRecord).order_by(col(CostRecord.recorded_at), col(CostRecord.id))
        vm_query = select(VmRecord).order_by(
            col(VmRecord.job), col(VmRecord.attempt), col(VmRecord.node_index), col(VmRecord.vm)
        )
        if job is not None:
            cost_query = cost_query.where(CostRecord.job == job, CostRecord.run == chosen)
            vm_query = vm_query.where(VmRecord.job == job, VmRecord.run == chosen)
        if team is not None:
            runs = team_runs(team)
            cost_query = cost_query.join(
                runs, sa.and_(runs.c.job == CostRecord.job, runs.c.run == CostRecord.run)
            )
            vm_query = vm_query.join(
                runs, sa.and_(runs.c.job == VmRecord.job, runs.c.run == VmRecord.run)
            )
        costs = list(session.exec(cost_query).all())
        rows = list(session.exec(vm_query).all())
    actuals = {cost.vm: cost for cost in costs if cost.kind == "actual" and cost.vm is not None}
    machines = [_machine(row, actuals.get(row.vm)) for row in rows]
    return CostReport(
        job=job,
        team=team,
        run=chosen,
        runs=[known.run for known in runs_of(db, job)] if job is not None else [],
        providers=_per_provider(costs, rows, machines),
        machines=machines if job is not None else [],
    )


def team_runs(team: str) -> sa.Subquery:
    """The (job, run) pairs of `team`'s runs, to join a table's rows on."""
    condition = col(JobRun.team) == team
    if team == DEFAULT_TEAM:
        condition = sa.or_(condition, col(JobRun.team).is_(None))
    return select(JobRun.job, JobRun.run, JobRun.gpus_per_node).where(condition).subquery()


def _machine(row: VmRecord, actual: CostRecord | None) -> MachineCost:
    quote = None
    if row.price_amount is not None and row.price_currency and row.price_unit:
        quote = Quote(
            amount=row.price_amount,
            currency=row.price_currency,
            unit=row.price_unit,
            source=row.price_source,
        )
    machine = MachineCost(
        vm=row.vm,
        attempt=row.attempt,
        node_index=row.node_index,
        provider=row.provider,
        region=row.region,
        zone=row.zone,
        instance_type=row.instance_type,
        status=row.status,
        quote=quote,
        launched_at=row.launched_at,
        gone_at=row.terminated_at,
    )
    if actual is not None:
        amount = Money(amount=actual.amount, currency=actual.currency, unit=actual.unit)
        update = {"billed_seconds": actual.billed_seconds, "amount": amount}
        return machine.model_copy(update=update | {"source": actual.source})
    reason = actual_or_reason(row)
    note = reason if isinstance(reason, str) else "no actual recorded"
    return machine.model_copy(update={"note": note})


def _per_provider(
    costs: Iterable[CostRecord], rows: Sequence[VmRecord], machines: Sequence[MachineCost]
) -> list[ProviderCost]:
    table: dict[tuple[str, str | None], ProviderCost] = {}

    def entry(job: str, provider: str | None) -> ProviderCost:
        return table.setdefault((job, provider), ProviderCost(job=job, provider=provider))

    for cost in costs:
        money = Money(amount=cost.amount, currency=cost.currency, unit=cost.unit)
        line = entry(cost.job, cost.provider)
        if cost.kind == "estimate" and money not in line.estimates:
            line.estimates.append(money)
        elif cost.kind == "actual":
            line.actual = _added(line.actual, money)
            line.with_actual += 1
    for row, machine in zip(rows, machines, strict=True):
        line = entry(row.job, row.provider)
        line.machines += 1
        launched = row.launched_at is not None or bool(row.instance_ids)
        if machine.quote is None and launched:
            line.unpriced.append(row.vm)
        if row.status == "kept":
            line.kept.append(row.vm)
        elif row.terminated_at is None:
            line.not_gone.append(row.vm)
    for line in table.values():
        line.estimates.sort(key=lambda money: (money.currency, money.unit, money.amount))
        line.actual.sort(key=lambda money: money.currency)
    return sorted(table.values(), key=lambda line: (line.job, line.provider is None, line.provider))


def _added(totals: list[Money], money: Money) -> list[Money]:
    """`totals` with `money` added to the total of its currency (never across currencies)."""
    for index, total in enumerate(totals):
        if total.currency == money.currency:
            summed = total.model_copy(update={"amount": total.amount + money.amount})
            return [*totals[:index], summed, *totals[index + 1 :]]
    return [*totals, money]
