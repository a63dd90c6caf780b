"""Plain-text views of jobs, offers, orphans, ended jobs and costs for the CLI and the demo."""

from __future__ import annotations

from datetime import datetime

from gpuprov.models import (
    HealthReport,
    JobStatus,
    OfferStats,
    TeamSpend,
    capabilities_text,
    offering_of,
)
from gpuprov.sdk.client import EndReport
from gpuprov.sdk.owners import JobSituation, Standing, Unheld
from gpuprov.store.costs import CostReport, MachineCost, Money, ProviderCost
from gpuprov.store.db import OrphanRecord
from providers.base import EVERY_OFFER, Offer, Severity


def price_text(offer: Offer) -> str:
    if offer.price is None:
        return "no price"
    quote = offer.price
    return f"{quote.amount:.2f} {quote.currency}/{quote.unit} ({quote.source})"


def progress_line(status: JobStatus) -> str:
    waiting = f" - waiting for {status.waiting_for}" if status.waiting_for else ""
    return f"[{status.state.value}]{waiting}"


def _losers_text(status: JobStatus) -> list[str]:
    """What the hedges' losing attempts cost, summed per currency (none: no line)."""
    spent: dict[str, float] = {}
    for attempt in status.attempts:
        if attempt.cost is not None:
            spent[attempt.cost.currency] = (
                spent.get(attempt.cost.currency, 0.0) + attempt.cost.amount
            )
    if not spent:
        return []
    hedges = sum(1 for attempt in status.attempts if attempt.hedge)
    total = ", ".join(f"{amount:.2f} {currency}" for currency, amount in sorted(spent.items()))
    return [f"  hedges: {hedges} started; the losing attempts cost {total}"]


def status_text(status: JobStatus) -> str:
    lines = [f"job {status.name}: {status.state.value}"]
    if status.run:
        lines.append(f"  run: {status.run}")
    if status.team:
        lines.append(f"  team: {status.team}")
    if status.waiting_for:
        lines.append(f"  waiting for: {status.waiting_for}")
    if status.hourly_cost is not None:
        cost = status.hourly_cost
        lines.append(f"  estimated cost: {cost.amount:.2f} {cost.currency}/{cost.unit}")
    lines += [f"  warning: {warning}" for warning in status.warnings]
    if status.attempts:
        lines.append("  offers tried:")
        for attempt in status.attempts:
            extra = " (hedge)" if attempt.hedge else ""
            if attempt.cost is not None:
                extra += f", cost {attempt.cost.amount:.2f} {attempt.cost.currency}"
            lines.append(f"    {attempt.describe()}  [{price_text(attempt.offer)}]{extra}")
        lines += _losers_text(status)
    if status.blocks:
        lines.append("  blocks:")
        for block in status.blocks:
            lines.append(
                f"    {block.scope.value} {block.key}: {block.kind.value}: {block.message}"
            )
    if status.nodes:
        lines.append("  instances:")
        for node in status.nodes:
            ids = ",".join(node.instance_ids) or "-"
            ssh = f" ssh {node.ssh.user}@{node.ssh.host}:{node.ssh.port}" if node.ssh else ""
            lines.append(
                f"    attempt {node.attempt} node {node.node_index} {node.vm} "
                f"[{node.provider}/{node.region}] {ids}: {node.status}{ssh}"
            )
            if node.worker_id and node.capabilities:
                lines.append(
                    f"      worker {node.worker_id}: {capabilities_text(node.capabilities)}"
                )
    if status.work:
        lines.append("  work:" + (f" (restart {len(status.restarts)})" if status.restarts else ""))
        for work in status.work:
            code = f", exit code {work.exit_code}" if work.exit_code is not None else ""
            lines.append(
                f"    node {work.rank} {work.vm or work.worker_id}: {work.state.value}{code}"
            )
    if status.restarts:
        lines.append("  restarts:")
        lines += [f"    {r.number} at {r.at.isoformat()}: {r.cause}" for r in status.restarts]
    if status.work_waits_until is not None:
        lines.append(
            f"  the new attempt's work waits until {status.work_waits_until.isoformat()} "
            "(an old node's lease and stop grace period)"
        )
    noticed = [w for w in status.workers if w.notice is not None]
    if noticed:
        lines.append("  the cloud's notices:")
        for worker in noticed:
            assert worker.notice is not None
            lines.append(f"    {worker.vm or worker.worker_id}: {worker.notice.kind}: "
                         f"{worker.notice.detail or worker.notice.action}")  # fmt: skip
    if status.existing_workers:
        lines.append("  existing workers:")
        for worker in status.existing_workers:
            lines.append(
                f"    {worker.worker_id} ({worker.label or '-'}): "
                f"{capabilities_text(worker.capabilities)}"
            )
    if status.leaks:
        lines.append("  POSSIBLE LEAKS (teardown did not confirm):")
        lines += [f"    {leak}" for leak in status.leaks]
    if status.ended_because:
        lines.append(f"  ended because: {status.ended_because}")
    if status.error:
        lines.append(f"  error: {status.error}")
    return "\n".join(lines)


def offers_text(offers: list[Offer], stats: dict[str, OfferStats] | None = None) -> str:
    """One row per offer, in the order a job tries them; with `stats`, each offering's recent
    record: ready out of attempts, sold-out failures, median and p95 seconds to ready."""
    if not offers:
        return "no compatible offers"
    header = f"{'offer':40} {'gpu':>10} {'vcpus':>6} {'mem GB':>7}  {'price':18}"
    rows = [header + ("  ready/tries  sold out  p50 s  p95 s" if stats is not None else "")]
    for offer in offers:
        gpu = f"{offer.gpu_count}x{offer.gpu_name or '-'}"
        row = (
            f"{offer.id:40} {gpu:>10} {offer.vcpus or '-':>6} {offer.memory_gb or '-':>7}  "
            f"{price_text(offer):18}"
        )
        if stats is not None:
            row += "  " + offer_stats_text(stats.get(offering_of(offer)))
        rows.append(row.rstrip())
    return "\n".join(rows)


def offer_stats_text(stats: OfferStats | None) -> str:
    if stats is None or stats.attempts == 0:
        return f"{'-':>11}  {'-':>8}  {'-':>5}  {'-':>5}"
    tries = f"{stats.ready}/{stats.attempts}"

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    return (
        f"{tries:>11}  {stats.capacity_failures:>8}  {seconds(stats.ready_p50_seconds):>5}  "
        f"{seconds(stats.ready_p95_seconds):>5}"
    )


def whole_provider_refusals(rejected: list[str]) -> list[str]:
    """The rejections that refuse every offer of a provider (`<provider>/*: <reasons>`): what a
    job asks that the provider cannot do. Single offers' rejections are left out."""
    return [line for line in rejected if line.partition(": ")[0].endswith(f"/{EVERY_OFFER}")]


def orphans_text(orphans: list[OrphanRecord], *, include_resolved: bool = False) -> str:
    """Two lines per possible orphan: where and what, then the last error."""
    if not orphans:
        return "no orphans" if include_resolved else "no open orphans"
    lines = []
    for orphan in orphans:
        ids = ", ".join(orphan.instance_ids) or "no ids"
        state = f"resolved {_when(orphan.resolved_at)}" if orphan.resolved_at else "OPEN"
        lines.append(
            f"{orphan.provider}/{orphan.region} {orphan.vm} [{ids}] first seen "
            f"{_when(orphan.first_seen)}, attempts {orphan.attempts}, {state}"
        )
        lines.append(f"    last error: {orphan.last_error}")
    return "\n".join(lines)


def situation_text(situation: JobSituation) -> str:
    """Why a job does not look after its machines, and what becomes of them."""
    job, detail = situation.job, situation.detail
    if situation.standing is Standing.ENDED:
        return f"job ended ({detail}): the reconciler deletes it after the grace period"
    if situation.standing is Standing.STUCK:
        return f"job stuck: {detail} - end it with `gpuprov end {job}`"
    if situation.standing is Standing.UNKNOWN:
        return f"owner unknown: {detail}"
    return "its running job does not hold it: the reconciler deletes it after the grace period"


def unheld_text(unheld: list[Unheld]) -> str:
    """Per job: its situation, then one line per machine it does not look after."""
    if not unheld:
        return "no machines whose job is stuck or whose owner is unknown"
    lines = ["machines whose job is stuck or whose owner is unknown:"]
    for group in unheld:
        lines.append(f"job {group.situation.job}: {situation_text(group.situation)}")
        for row in group.vms:
            ids = ", ".join(row.instance_ids) or "no ids"
            lines.append(
                f"    {row.provider}/{row.region} {row.vm} [{ids}]: {row.status} "
                f"(recorded {_when(row.created_at)})"
            )
    return "\n".join(lines)


def end_text(report: EndReport) -> str:
    """`gpuprov end`: the workflow, each machine of the job by outcome, and the verdict."""
    lines = [f"job {report.job}: workflow {report.workflow}"]
    lines += [f"    deleted, confirmed gone: {vm}" for vm in report.deleted_vms]
    lines += [f"    already gone, record closed: {vm}" for vm in report.gone_vms]
    lines += [f"    kept on purpose (release: keep), not touched: {vm}" for vm in report.kept_vms]
    lines += [f"    left: {line}" for line in report.left_open]
    lines += [f"    error: {line}" for line in report.errors]
    if report.nothing_left:
        lines.append(f"nothing of job {report.job} is left live")
    else:
        lines.append(
            f"{report.still_open} machine(s) of job {report.job} left (see above); "
            f"`gpuprov end {report.job}` again sweeps them once the cause is fixed"
        )
    return "\n".join(lines)


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def health_text(reports: list[HealthReport]) -> str:
    """One line per machine with its verdict, then its findings (most severe first)."""
    order = {Severity.CRITICAL: 0, Severity.WARN: 1, Severity.INFO: 2}
    lines = []
    for report in reports:
        lines.append(f"{report.vm}: {report.verdict.value}")
        for finding in sorted(report.findings, key=lambda f: order[f.severity]):
            lines.append(f"    {finding.severity.value:8} {finding.code}: {finding.message}")
    return "\n".join(lines) or "no machines"


COST_FORMULA = (
    "actual = quote x running time (launched to confirmed gone, gpuprov's clock) rounded up at "
    "the cloud's billing granularity and minimum; not the cloud's invoice"
)


def cost_text(report: CostReport) -> str:
    """`gpuprov cost`: per job and provider, the hourly estimates and the actual totals (per
    currency), then why machines have none; with a job, each machine first; with a team, its
    month against its budget first."""
    budget = budget_lines(report.budget) if report.budget is not None else []
    if not report.providers:
        suffix = f" for job {report.job}" if report.job else ""
        suffix += f" of team {report.team}" if report.team else ""
        return "\n".join([*budget, f"no cost records or machines{suffix}"])
    lines = [*budget, f"job {report.job}:"] if report.job else list(budget)
    if report.job and report.run:
        earlier = [run for run in report.runs if run != report.run]
        lines.append(
            f"  run {report.run}" + (f" (other runs: {', '.join(earlier)})" if earlier else "")
        )
    for machine in report.machines:
        lines += _machine_lines(machine)
    for line in report.providers:
        lines += _provider_lines(line)
    lines.append(COST_FORMULA)
    return "\n".join(lines)


def budget_lines(spend: TeamSpend) -> list[str]:
    """A team's month so far against its limits."""
    month = spend.month_start.strftime("%Y-%m")
    if spend.monthly_budget_usd is None:
        money = f"{spend.spent_usd:.2f} USD spent in {month} (no monthly budget)"
    else:
        money = (
            f"{spend.spent_usd:.2f} of {spend.monthly_budget_usd:.2f} USD spent in {month}, "
            f"{spend.left_usd or 0:.2f} left (on_exceed = {spend.on_exceed})"
        )
    gpus = f"{spend.gpus_held} GPU(s) held" + (
        f" of {spend.max_gpus}" if spend.max_gpus is not None else ""
    )
    rate = f", accruing {spend.accruing_usd_per_hour:.2f} USD/hour"
    other = "".join(
        f"; {amount:.2f} {currency} not counted (not USD)"
        for currency, amount in sorted(spend.other_currencies.items())
    )
    return [f"team {spend.team}: {money}; {gpus}{rate}{other}"]


def _money(money: Money) -> str:
    # Cents, but a short run's fraction of a cent still shows.
    digits = 2 if money.amount == 0 or money.amount >= 0.1 else 4
    amount = f"{money.amount:.{digits}f}"
    per = f"/{money.unit}" if money.unit != "total" else ""
    return f"{amount} {money.currency}{per}"


def _provider_lines(line: ProviderCost) -> list[str]:
    provider = line.provider or "(provider not recorded)"
    estimate = ", ".join(_money(m) for m in line.estimates) or "none recorded"
    actual = " + ".join(_money(m) for m in line.actual) if line.actual else "none"
    lines = [
        f"{line.job} on {provider}: estimate {estimate}; actual {actual} "
        f"({line.with_actual} of {line.machines} machine(s) with an actual)"
    ]
    for vms, why in (
        (line.unpriced, "no quote, so no actual cost can be computed"),
        (line.kept, "kept (release: keep), still running: no actual"),
        (line.not_gone, "not confirmed gone yet: no actual yet"),
    ):
        if vms:
            lines.append(f"    {why}: {', '.join(vms)}")
    return lines


def _machine_lines(machine: MachineCost) -> list[str]:
    where = f"{machine.provider}/{machine.zone or machine.region}"
    quote = machine.quote
    quoted = f"{quote.amount:g} {quote.currency}/{quote.unit}" if quote else "no quote"
    launched = _when(machine.launched_at) if machine.launched_at else "-"
    gone = _when(machine.gone_at) if machine.gone_at else "-"
    lines = [
        f"  attempt {machine.attempt} node {machine.node_index} {machine.vm} [{where} "
        f"{machine.instance_type or '-'}] {machine.status}",
        f"      quote {quoted}; launched {launched}; gone {gone}",
    ]
    if machine.amount is not None and machine.billed_seconds is not None:
        lines.append(f"      billed {machine.billed_seconds:g} s: {_money(machine.amount)}")
    else:
        lines.append(f"      {machine.note}")
    return lines
