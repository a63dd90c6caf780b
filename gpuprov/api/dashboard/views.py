"""What each dashboard page shows, read from Temporal and the database: plain models the
templates render (gpuprov/api/dashboard/templates). Nothing here writes.

    job_rows(...)        the jobs list: summary, GPUs held, cost so far
    job_page(...)        one job: status (attempts, blocks, nodes), logs, machines' cost
    node_rows(status)    a job's nodes joined with their workers' liveness and GPU health
    spend_page(...)      teams against budgets, providers this month, as bar charts
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from pydantic import Field

from gpuprov.api.dashboard.charts import Bar, bars
from gpuprov.models import HealthReport, JobStatus, NodeWork, TeamSpend, WorkerLiveness
from gpuprov.sdk.client import JobSummary
from gpuprov.store.costs import CostReport, cost_report
from gpuprov.store.db import Database, utcnow
from gpuprov.store.logs import Lines, LogRecords, prefixed
from gpuprov.store.runs import RunNotFound
from gpuprov.store.spend import JobSpend, ProviderSpend, jobs_spend, providers_spend
from gpuprov.store.teams import Teams, month_start
from providers.base import Model

LOG_CHUNKS = 2000  # the most chunks a page renders before the script follows on
LOG_LINES = 500  # the last lines shown without the script


class JobRow(Model):
    job: JobSummary
    spend: JobSpend | None = None


class NodeRow(Model):
    attempt: int
    index: int
    vm: str
    where: str
    status: str
    worker: WorkerLiveness | None = None
    health: HealthReport | None = None
    work: NodeWork | None = None


class LogView(Model):
    run: str | None
    lines: list[str] = Field(default_factory=list)
    after: int = 0  # the last chunk shown
    cut: bool = False  # earlier lines not shown here


class JobPage(Model):
    name: str
    team: str
    state: str
    status: JobStatus | None
    nodes: list[NodeRow]
    logs: LogView
    cost: CostReport | None
    spend: JobSpend | None
    temporal_url: str | None


class SpendPage(Model):
    month_start: datetime
    teams: list[TeamSpend]
    team_bars: list[Bar]
    providers: list[ProviderSpend]
    provider_bars: list[Bar]


async def job_rows(db: Database, jobs: list[JobSummary]) -> list[JobRow]:
    spends = await asyncio.to_thread(jobs_spend, db, [job.name for job in jobs])
    return [JobRow(job=job, spend=spends.get(job.name)) for job in jobs]


def node_rows(status: JobStatus) -> list[NodeRow]:
    workers = {worker.worker_id: worker for worker in status.workers}
    health = {report.vm: report for report in status.health}
    work = {item.vm: item for item in status.work if item.vm}
    return [
        NodeRow(
            attempt=node.attempt,
            index=node.node_index,
            vm=node.vm,
            where="/".join(part for part in (node.provider, node.region, node.zone) if part),
            status=node.status,
            worker=workers.get(node.worker_id) if node.worker_id else None,
            health=health.get(node.vm),
            work=work.get(node.vm),
        )
        for node in status.nodes
    ]


def log_view(db: Database, job: str, run: str | None) -> LogView:
    page = LogRecords(db).chunks(job, 0, None, LOG_CHUNKS, run)
    lines = Lines()
    text = [prefixed(line) for line in [*lines.feed(page.chunks), *lines.flush()]]
    return LogView(
        run=run,
        lines=text[-LOG_LINES:],
        after=page.next_after,
        cut=len(text) > LOG_LINES or len(page.chunks) == LOG_CHUNKS,
    )


async def job_page(
    db: Database,
    name: str,
    team: str,
    state: str,
    status: JobStatus | None,
    temporal_url: str | None,
) -> JobPage:
    run = status.run if status is not None else None

    def read() -> tuple[CostReport | None, JobSpend | None, LogView]:
        try:
            cost = cost_report(db, name, run)
        except RunNotFound:
            cost = None
        spend = jobs_spend(db, [name]).get(name)
        return cost, spend, log_view(db, name, run or (cost.run if cost else None))

    cost, spend, logs = await asyncio.to_thread(read)
    return JobPage(
        name=name,
        team=team,
        state=status.state.value if status is not None else state,
        status=status,
        nodes=node_rows(status) if status is not None else [],
        logs=logs,
        cost=cost,
        spend=spend,
        temporal_url=temporal_url,
    )


async def spend_page(db: Database, teams: Teams, names: list[str], team: str | None) -> SpendPage:
    """`names`' month against their budgets; per provider, `team`'s runs (None: everyone's)."""

    def read() -> SpendPage:
        now = utcnow()
        start = month_start(now)
        spends = [teams.spend(name, now) for name in names]
        providers = providers_spend(db, team, start, now)
        return SpendPage(
            month_start=start,
            teams=spends,
            team_bars=bars(
                [(spend.team, spend.spent_usd, spend.monthly_budget_usd) for spend in spends]
            ),
            providers=providers,
            provider_bars=bars(
                [(line.provider, line.spent.get("USD", 0.0), None) for line in providers]
            ),
        )

    return await asyncio.to_thread(read)
