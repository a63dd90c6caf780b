"""The scarcity scenario's section of the bench report and its target (bench/scarcity.py)."""

from __future__ import annotations

from bench.scarcity import BOOT_TIMEOUT_MINUTES, PolicyRun
from bench.scarcity_model import OFFERINGS
from bench.stats import fmt, percentile

SEQUENTIAL, HEDGED = "sequential", "hedge 2"
TARGET = (
    "scarcity: hedge 2's p99 to ready ≤ ½ sequential's, losers ≤ 10% of the winners' first hour"
)


def target(runs: list[PolicyRun]) -> tuple[str, str, bool | None]:
    """(target, measured, met); met None when either policy did not run."""
    by_name = {run.policy: run for run in runs}
    sequential, hedged = by_name.get(SEQUENTIAL), by_name.get(HEDGED)
    if sequential is None or hedged is None:
        return TARGET, "-", None
    base, ours = percentile(sequential.times(), 99), percentile(hedged.times(), 99)
    share = hedged.loser_share()
    if base is None or ours is None:
        return TARGET, "-", None
    measured = (
        f"p99 {ours:.1f} min against {base:.1f} ({ours / base:.2f}); losers "
        f"{fmt(None if share is None else 100 * share, 1)}%"
    )
    return TARGET, measured, ours <= base / 2 and (share or 0.0) <= 0.10


def section(runs: list[PolicyRun]) -> list[str]:
    if not runs:
        return []
    jobs = len(runs[0].jobs)
    lines = [
        "## Time to GPU when GPUs are scarce",
        "",
        f"{jobs} single-node jobs arriving over the same modelled window, once per policy, "
        'against the same stockouts (docs/performance.md, "Time to GPU when GPUs are '
        f'scarce"); one modelled minute is one second. Deadline {runs[0].deadline_minutes:g} min '
        f"(provisioning_timeout_seconds), boot timeout {BOOT_TIMEOUT_MINUTES} min. Times in "
        "modelled minutes, submit to every node ready, over the jobs that got GPUs.",
        "",
    ]
    header = [
        "policy",
        "got GPUs by the deadline",
        "p50 / p95 / p99 to ready (min)",
        "hedges",
        "losers' spend (of the winners' first hour)",
        "creates per offering (sold out)",
        "leaks",
    ]
    rows = []
    for run in runs:
        times = run.times()
        share = run.loser_share()
        creates = ", ".join(
            f"{o.region} {run.creates.get(o.region, 0)} ({run.sold_out.get(o.region, 0)})"
            for o in OFFERINGS
        )
        rows.append(
            [
                run.policy,
                f"{run.in_time()}/{len(run.jobs)}",
                " / ".join(fmt(percentile(times, p), 1) for p in (50, 95, 99)),
                str(run.hedges),
                "-" if share is None else f"{100 * share:.1f}%",
                creates,
                str(run.leaks),
            ]
        )
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    stock = ", ".join(
        f"{region} {100 * share:.0f}%" for region, share in runs[0].sold_out_share.items()
    )
    lines += ["", f"Share of the first policy's run each offering was sold out: {stock}.", ""]
    return lines
