"""The issue-8 targets, checked against one run's results: (target, measured, verdict)."""

from __future__ import annotations

from bench import api_failover_report, heartbeat_report, scarcity_report
from bench.stats import (
    BenchResults,
    end_to_end,
    fmt,
    gone_overhead,
    percentile,
    ready_overhead,
    total_overhead,
)

TARGET_JOBS = 100  # the concurrency the overhead and ratio targets are set at
MAX_HAPPY_EVENTS = 200
MET, MISSED, NOT_MEASURED = "met", "**missed**", "not measured"

Check = tuple[str, str, str]


def targets(results: BenchResults) -> list[Check]:
    return [
        *_overhead_and_ratio(results),
        _throughput(results),
        _failover(results),
        _observe(results),
        _history(results),
        _heartbeats(results),
        _api_failover(results),
        _scarcity(results),
    ]


def _verdict(ok: bool | None) -> str:
    return NOT_MEASURED if ok is None else MET if ok else MISSED


def _overhead_and_ratio(results: BenchResults) -> list[Check]:
    run = next((r for r in results.overhead if r.jobs == TARGET_JOBS and not r.error), None)
    overhead_target = "p50 overhead ≤ 0.5 s per single-node job at 100 jobs"
    ratio_target = "gpuprov / baseline ≤ 2 at 100 jobs (p50)"
    if run is None:
        return [(overhead_target, "-", NOT_MEASURED), (ratio_target, "-", NOT_MEASURED)]
    total = percentile(total_overhead(run), 50)
    ready = percentile(ready_overhead(run, run.gpuprov), 50)
    gone = percentile(gone_overhead(run, run.gpuprov), 50)
    ours = percentile(end_to_end(run.gpuprov), 50)
    base = percentile(end_to_end(run.baseline), 50)
    ratio = ours / base if ours is not None and base else None
    return [
        (
            overhead_target,
            f"{fmt(total)} s (to ready {fmt(ready)} + to gone {fmt(gone)})",
            _verdict(None if total is None else total <= 0.5),
        ),
        (ratio_target, fmt(ratio), _verdict(None if ratio is None else ratio <= 2)),
    ]


def _throughput(results: BenchResults) -> Check:
    rate = results.throughput.jobs_per_second if results.throughput else None
    return (
        "≥ 20 jobs/s per worker, zero latency",
        f"{fmt(rate, 1)} jobs/s",
        _verdict(None if rate is None else rate >= 20),
    )


def _failover(results: BenchResults) -> Check:
    after = [sample.after_teardown for run in results.failover for sample in run.samples]
    worst = max(after, default=None)
    return (
        "failover ≤ 1 s + the teardown the policy requires",
        f"worst {fmt(worst)} s after teardown (p50 {fmt(percentile(after, 50))} s)",
        _verdict(None if worst is None else worst <= 1.0),
    )


def _observe(results: BenchResults) -> Check:
    """Only a run where every job was still waiting measures the waits' call rate: calls from
    the teardown of failed jobs would count against it."""
    clean = [r for r in results.observe if r.per_interval is not None and r.still_waiting == r.jobs]
    unclean = [r for r in results.observe if r not in clean]
    worst = max((r.per_interval or 0.0 for r in clean), default=None)
    measured = (
        "-"
        if worst is None
        else f"worst {worst:.2f} at {'/'.join(str(r.jobs) for r in clean)} jobs"
    )
    for run in unclean:
        why = run.error or f"only {run.still_waiting} still waiting"
        measured += f"; {run.jobs} jobs not measurable ({why})"
    verdict = _verdict(None if worst is None else worst <= 1.0)
    if verdict == MET and unclean:
        verdict = "met where measured"
    return ("observe calls per (provider, region) per poll interval ≤ 1", measured, verdict)


def _history(results: BenchResults) -> Check:
    happy = [t.events for r in results.overhead if r.jobs == 1 for t in r.gpuprov]
    events = max(happy, default=None)
    return (
        "≤ 200 history events, single-node happy path",
        "-" if events is None else f"{events} events",
        _verdict(None if events is None else events <= MAX_HAPPY_EVENTS),
    )


def _heartbeats(results: BenchResults) -> Check:
    name, measured, ok = heartbeat_report.target(results.heartbeats)
    return name, measured, _verdict(ok)


def _api_failover(results: BenchResults) -> Check:
    name, measured, ok = api_failover_report.target(results.api_failover)
    return name, measured, _verdict(ok)


def _scarcity(results: BenchResults) -> Check:
    target, measured, met = scarcity_report.target(results.scarcity)
    return target, measured, _verdict(met)
