"""What jobs and providers have cost so far, for the dashboard's lists and charts.

    accrued(vm, since, now)          a held machine's cost from `since` to now, by its quote
    jobs_spend(db, jobs, now)        each named job's latest run: spent so far, GPUs held
    providers_spend(db, team, now)   this month per provider (one team's runs, or everyone's)

Spent so far is what gpuprov/store/teams.py counts for a budget: the actual of every machine
confirmed gone, plus each held machine's quote from its launch to now. Amounts stay per
currency (never converted); a machine without a quote adds nothing (a price is never invented).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from pydantic import Field
from sqlmodel import col, select

from gpuprov.store.costs import UNIT_SECONDS, team_runs
from gpuprov.store.db import CostRecord, Database, JobRun, VmRecord, utcnow
from providers.base import Model

# A machine not yet confirmed gone: it is held (and billed, once launched).
HELD_STATUSES = ("recorded", "created", "running", "terminating", "kept")


class Accrual(Model):
    currency: str
    amount: float  # from `since` to now
    per_hour: float  # the machine's rate


class JobSpend(Model):
    job: str
    run: str
    spent: dict[str, float] = Field(default_factory=dict)  # per currency
    per_hour: dict[str, float] = Field(default_factory=dict)  # what its held machines accrue
    machines_held: int = 0
    gpus_held: int = 0


class ProviderSpend(Model):
    provider: str
    spent: dict[str, float] = Field(default_factory=dict)  # this month, per currency
    machines_held: int = 0


def accrued(vm: VmRecord, since: datetime | None, now: datetime) -> Accrual | None:
    """What the held machine `vm` has cost from its launch (or `since`, when later) to `now`;
    None without a quote in a known unit."""
    unit = UNIT_SECONDS.get(vm.price_unit or "")
    if vm.price_amount is None or unit is None or not vm.price_currency:
        return None
    start = vm.launched_at or vm.created_at
    if since is not None:
        start = max(start, since)
    seconds = max(0.0, (now - start).total_seconds())
    return Accrual(
        currency=vm.price_currency,
        amount=vm.price_amount * seconds / unit,
        per_hour=vm.price_amount * 3600 / unit,
    )


def _add(totals: dict[str, float], currency: str, amount: float) -> None:
    totals[currency] = round(totals.get(currency, 0.0) + amount, 6)


def jobs_spend(
    db: Database, jobs: Sequence[str], now: datetime | None = None
) -> dict[str, JobSpend]:
    """Each of `jobs`' latest run (a name never run has no entry): what it has cost so far and
    what it holds now."""
    now = now or utcnow()
    if not jobs:
        return {}
    with db.session() as session:
        latest = (
            select(JobRun.job, sa.func.max(JobRun.created_at).label("created_at"))
            .where(col(JobRun.job).in_(list(jobs)))
            .group_by(col(JobRun.job))
            .subquery()
        )
        runs = session.exec(
            select(JobRun).join(
                latest,
                sa.and_(latest.c.job == JobRun.job, latest.c.created_at == JobRun.created_at),
            )
        ).all()
        chosen = {row.job: row for row in runs}
        pairs = [(row.job, row.run) for row in chosen.values()]
        if not pairs:
            return {}
        pair_filter = sa.tuple_(col(CostRecord.job), col(CostRecord.run)).in_(pairs)
        actuals = session.exec(
            select(CostRecord).where(CostRecord.kind == "actual", pair_filter)
        ).all()
        machines = session.exec(
            select(VmRecord).where(sa.tuple_(col(VmRecord.job), col(VmRecord.run)).in_(pairs))
        ).all()
    spends = {job: JobSpend(job=job, run=row.run) for job, row in chosen.items()}
    for cost in actuals:
        _add(spends[cost.job].spent, cost.currency, cost.amount)
    for vm in machines:
        if vm.status not in HELD_STATUSES or vm.terminated_at is not None:
            continue
        spend = spends[vm.job]
        spend.machines_held += 1
        spend.gpus_held += chosen[vm.job].gpus_per_node or 0
        accrual = accrued(vm, None, now) if vm.launched_at or vm.instance_ids else None
        if accrual is not None:
            _add(spend.spent, accrual.currency, accrual.amount)
            _add(spend.per_hour, accrual.currency, accrual.per_hour)
    return spends


def providers_spend(
    db: Database, team: str | None, month_start: datetime, now: datetime | None = None
) -> list[ProviderSpend]:
    """Since `month_start`, per provider: the actuals recorded and what held machines accrued
    (of `team`'s runs; every run's with None), the dearest in USD first."""
    now = now or utcnow()
    with db.session() as session:
        cost_query = select(CostRecord).where(
            CostRecord.kind == "actual", col(CostRecord.recorded_at) >= month_start
        )
        vm_query = select(VmRecord).where(
            col(VmRecord.status).in_(HELD_STATUSES), col(VmRecord.terminated_at).is_(None)
        )
        if team is not None:
            runs = team_runs(team)
            cost_query = cost_query.join(
                runs, sa.and_(runs.c.job == CostRecord.job, runs.c.run == CostRecord.run)
            )
            vm_query = vm_query.join(
                runs, sa.and_(runs.c.job == VmRecord.job, runs.c.run == VmRecord.run)
            )
        actuals = session.exec(cost_query).all()
        held = session.exec(vm_query).all()
    table: dict[str, ProviderSpend] = {}

    def entry(provider: str | None) -> ProviderSpend:
        name = provider or "unknown"
        return table.setdefault(name, ProviderSpend(provider=name))

    for cost in actuals:
        _add(entry(cost.provider).spent, cost.currency, cost.amount)
    for vm in held:
        line = entry(vm.provider)
        line.machines_held += 1
        accrual = accrued(vm, month_start, now)
        if accrual is not None:
            _add(line.spent, accrual.currency, accrual.amount)
    return sorted(table.values(), key=lambda line: (-line.spent.get("USD", 0.0), line.provider))
