"""Teams and their budgets: who a run belongs to, what a team has spent and holds.

    Teams.create(name, ...), update(name, ...), get(name), all()   the `teams` rows
    Teams.admit_run(job, run, team, gpus_per_node)                  a run's team, recorded once
    Teams.team_of(job, run)                                         whose run it is (or latest)
    Teams.spend(team, now)                                          month-to-date, against budget

A team's spend this month (a calendar month in UTC) is what its runs' machines cost: the
actual of every machine confirmed gone since the month began (gpuprov/store/costs.py), and, for
each machine still held, its quote from launch (or the month's start) to now. Only USD counts
against a budget in USD; a quote in another currency is shown apart and never converted. A
machine without a quote has no cost to count: a price is never invented. GPUs held are the
machines not yet gone (recorded, created, running, terminating, kept) times the GPUs each holds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlmodel import col, select

from gpuprov.models import DEFAULT_TEAM, TEAM_NAME_PATTERN, TeamSpend
from gpuprov.store.costs import team_runs
from gpuprov.store.db import (
    ON_EXCEED,
    CostRecord,
    Database,
    JobRun,
    TeamRecord,
    VmRecord,
    dialect_insert,
    utcnow,
)
from gpuprov.store.spend import HELD_STATUSES, accrued
from providers.base import Model

MAX_BUDGET_USD = 10_000_000.0
MAX_TEAM_GPUS = 1_000_000


class TeamRefused(ValueError):
    """A team that cannot be created or changed as asked; `argument` names what is wrong."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


class TeamNotFound(LookupError):
    pass


class TeamView(Model):
    name: str
    monthly_budget_usd: float | None
    max_gpus: int | None
    on_exceed: str
    created_at: datetime


def month_start(now: datetime) -> datetime:
    now = now.astimezone(UTC)
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def check_team_name(name: str) -> str:
    if not re.fullmatch(TEAM_NAME_PATTERN, name):
        raise TeamRefused(
            "name", f"{name[:64]!r} is not a team name (lowercase letters, digits and -, 1-40)"
        )
    return name


def _check_limits(budget: float | None, gpus: int | None, on_exceed: str | None) -> None:
    if budget is not None and not 0 <= budget <= MAX_BUDGET_USD:
        raise TeamRefused("monthly-budget", f"a budget is 0-{MAX_BUDGET_USD:g} USD a month")
    if gpus is not None and not 0 <= gpus <= MAX_TEAM_GPUS:
        raise TeamRefused("max-gpus", f"a GPU limit is 0-{MAX_TEAM_GPUS}")
    if on_exceed is not None and on_exceed not in ON_EXCEED:
        raise TeamRefused("on-exceed", f"{on_exceed!r} is not one of {', '.join(ON_EXCEED)}")


class Teams:
    """Reads and writes of `teams` and the team of each run; each call its own transaction."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def create(
        self,
        name: str,
        *,
        monthly_budget_usd: float | None = None,
        max_gpus: int | None = None,
        on_exceed: str = "release",
    ) -> TeamView:
        check_team_name(name)
        _check_limits(monthly_budget_usd, max_gpus, on_exceed)
        with self.db.session() as session:
            if session.get(TeamRecord, name) is not None:
                raise TeamRefused("name", f"a team named {name!r} exists already")
            row = TeamRecord(
                name=name,
                monthly_budget_usd=monthly_budget_usd,
                max_gpus=max_gpus,
                on_exceed=on_exceed,
                created_at=utcnow(),
            )
            session.add(row)
            session.commit()
            session.refresh(row)
            return TeamView.model_validate(row, from_attributes=True)

    def update(
        self,
        name: str,
        *,
        monthly_budget_usd: float | None = None,
        max_gpus: int | None = None,
        on_exceed: str | None = None,
        clear_budget: bool = False,
        clear_gpus: bool = False,
    ) -> TeamView:
        _check_limits(monthly_budget_usd, max_gpus, on_exceed)
        with self.db.session() as session:
            row = session.get(TeamRecord, name)
            if row is None:
                raise TeamNotFound(f"no team named {name!r}")
            if monthly_budget_usd is not None or clear_budget:
                row.monthly_budget_usd = monthly_budget_usd
            if max_gpus is not None or clear_gpus:
                row.max_gpus = max_gpus
            if on_exceed is not None:
                row.on_exceed = on_exceed
            session.add(row)
            session.commit()
            session.refresh(row)
            return TeamView.model_validate(row, from_attributes=True)

    def get(self, name: str) -> TeamView | None:
        with self.db.session() as session:
            row = session.get(TeamRecord, name)
            return None if row is None else TeamView.model_validate(row, from_attributes=True)

    def all(self) -> list[TeamView]:
        with self.db.session() as session:
            rows = session.exec(select(TeamRecord).order_by(col(TeamRecord.name))).all()
            return [TeamView.model_validate(row, from_attributes=True) for row in rows]

    # ------------------------------------------------------------------ runs

    def admit_run(self, job: str, run: str, team: str, gpus_per_node: int) -> None:
        """Record `run` of `job` as `team`'s (its row written now, or given its team)."""
        insert = dialect_insert(self.db.dialect)
        statement = insert(JobRun).values(
            job=job, run=run, created_at=utcnow(), team=team, gpus_per_node=gpus_per_node
        )
        statement = statement.on_conflict_do_update(
            index_elements=["job", "run"],
            set_={"team": team, "gpus_per_node": gpus_per_node},
        )
        with self.db.session() as session:
            session.execute(statement)
            session.commit()

    def team_of(self, job: str, run: str | None = None) -> str | None:
        """The team of `run` of `job` (its latest run without one); None: no such job or run.
        A run from before teams is the default team's."""
        with self.db.session() as session:
            query = select(JobRun).where(JobRun.job == job)
            if run is not None:
                query = query.where(JobRun.run == run)
            rows = session.exec(query.order_by(col(JobRun.created_at), col(JobRun.run))).all()
        if not rows:
            return None
        return rows[-1].team or DEFAULT_TEAM

    # ------------------------------------------------------------------ spend

    def spend(self, team: str, now: datetime | None = None) -> TeamSpend:
        now = now or utcnow()
        start = month_start(now)
        row = self.get(team)
        if row is None:
            raise TeamNotFound(f"no team named {team!r}")
        spent, other, rate, gpus = 0.0, dict[str, float](), 0.0, 0
        with self.db.session() as session:
            runs = team_runs(team)
            actuals = session.exec(
                select(CostRecord.currency, sa.func.sum(CostRecord.amount))
                .join(
                    runs,
                    sa.and_(runs.c.job == CostRecord.job, runs.c.run == CostRecord.run),
                )
                .where(CostRecord.kind == "actual", col(CostRecord.recorded_at) >= start)
                .group_by(CostRecord.currency)
            ).all()  # summed by the database, not row by row here
            held = session.exec(
                select(VmRecord, runs.c.gpus_per_node)
                .join(
                    runs,
                    sa.and_(runs.c.job == VmRecord.job, runs.c.run == VmRecord.run),
                )
                .where(
                    col(VmRecord.status).in_(HELD_STATUSES),
                    col(VmRecord.terminated_at).is_(None),
                )
            ).all()
        for currency, amount in actuals:
            if currency == "USD":
                spent += amount
            else:
                other[currency] = other.get(currency, 0.0) + amount
        for vm, gpus_per_node in held:
            gpus += gpus_per_node or 0
            accrual = accrued(vm, start, now)
            if accrual is None:
                continue
            if accrual.currency == "USD":
                spent += accrual.amount
                rate += accrual.per_hour
            else:
                other[accrual.currency] = other.get(accrual.currency, 0.0) + accrual.amount
        return TeamSpend(
            team=team,
            month_start=start,
            spent_usd=round(spent, 6),
            accruing_usd_per_hour=round(rate, 6),
            other_currencies={key: round(value, 6) for key, value in other.items()},
            gpus_held=gpus,
            monthly_budget_usd=row.monthly_budget_usd,
            max_gpus=row.max_gpus,
            on_exceed=row.on_exceed,
        )
