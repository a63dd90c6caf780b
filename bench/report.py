"""Results -> one markdown document: the tables, what was subtracted, and the issue-8 targets."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from bench import (
    api_failover_report,
    billed_idle_report,
    handover_report,
    heartbeat_report,
    scarcity_report,
)
from bench.cpu import CpuTimes
from bench.scenarios import (
    GONE_CALLS,
    OVERHEAD,
    READY_CALLS,
    WAITING,
    WAVE,
    ZERO,
    FailoverSample,
    OverheadRun,
    ThroughputRun,
    batch_wall,
)
from bench.stats import (
    BenchResults,
    end_to_end,
    fmt,
    gone_overhead,
    percentile,
    ready_overhead,
    total_overhead,
)
from bench.targets import targets


def _pair(values: list[float]) -> str:
    return f"{fmt(percentile(values, 50))} / {fmt(percentile(values, 99))}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _cpu(cpu: CpuTimes | None) -> str:
    return "-" if cpu is None else f"{cpu.bench:.1f} / {cpu.server:.1f}"


def _timing_text(settings: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:g}" for key, value in settings.items())


# ---------------------------------------------------------------- sections


def _overhead(results: BenchResults) -> list[str]:
    latency = OVERHEAD["call_latency_seconds"]
    lines = [
        "## Overhead per single-node job",
        "",
        f"Fake cloud: {_timing_text(OVERHEAD)} (seconds). Subtracted from every job (gpuprov "
        f"and baseline alike): to ready, boot_delay + {READY_CALLS} calls x {latency:g} s "
        f"(plan, prepare, create, the observe that sees Running) = "
        f"{OVERHEAD['boot_delay_seconds'] + READY_CALLS * latency:.2f} s; to gone, delete_delay + "
        f"{GONE_CALLS} calls x {latency:g} s (delete, the observe that sees nothing, cleanup) = "
        f"{OVERHEAD['delete_delay_seconds'] + GONE_CALLS * latency:.2f} s. What remains includes "
        "poll quantisation (up to one poll interval per wait), which the baseline pays too.",
        "",
    ]
    rows = [
        [
            str(run.jobs),
            _pair(ready_overhead(run, run.gpuprov)),
            _pair(gone_overhead(run, run.gpuprov)),
            _pair(total_overhead(run)),
            _pair(ready_overhead(run, run.baseline)),
            _pair(gone_overhead(run, run.baseline)),
            f"{sum(t.ok for t in run.gpuprov)}/{run.jobs}"
            + (f" ({run.error})" if run.error else ""),
            str(sum(t.retried_steps for t in run.gpuprov)),
            _cpu(run.cpu),
            f"{run.peak_rss_mb:.0f}",
        ]
        for run in results.overhead
    ]
    header = [
        "jobs at once",
        "submit→ready p50 / p99 (s)",
        "release→gone p50 / p99 (s)",
        "total p50 / p99 (s)",
        "baseline ready p50 / p99",
        "baseline gone p50 / p99",
        "jobs done",
        "steps retried",
        "CPU s: worker / server",
        "peak RSS so far (MiB)",
    ]
    return lines + _table(header, rows) + [""] + _failures(results.overhead)


def _failures(runs: list[OverheadRun]) -> list[str]:
    """Why jobs did not finish (the three commonest reasons per run, shortened)."""
    lines = []
    for run in runs:
        reasons = Counter(t.outcome for t in run.gpuprov if not t.ok)
        if not reasons:
            continue
        top = "; ".join(f"{count} x `{_short(reason)}`" for reason, count in reasons.most_common(3))
        lines.append(
            f"- {run.jobs} jobs: {sum(reasons.values())} not done (the percentiles above are "
            f"over the jobs done): {top}"
        )
    return lines + [""] if lines else []


def _short(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split()).replace("`", "'")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _limit(results: BenchResults) -> list[str]:
    lines = [
        "## The limit: gpuprov / plain asyncio loop",
        "",
        "Same cloud, same process, same concurrency; per job, submit→ready plus release→gone "
        "(the ready period itself excluded). Batch wall: first submit to last gone.",
        "",
    ]
    rows = []
    for run in results.overhead:
        ours, base = end_to_end(run.gpuprov), end_to_end(run.baseline)
        p50, base50 = percentile(ours, 50), percentile(base, 50)
        p99, base99 = percentile(ours, 99), percentile(base, 99)
        wall = batch_wall(run.gpuprov) if not run.error else None
        base_wall = batch_wall(run.baseline)
        rows.append(
            [
                str(run.jobs),
                f"{fmt(p50)} / {fmt(p99)}",
                f"{fmt(base50)} / {fmt(base99)}",
                _ratio(p50, base50),
                _ratio(p99, base99),
                f"{fmt(wall, 1)} / {fmt(base_wall, 1)}",
                _ratio(wall, base_wall),
            ]
        )
    header = [
        "jobs at once",
        "gpuprov p50 / p99 (s)",
        "baseline p50 / p99 (s)",
        "ratio p50",
        "ratio p99",
        "batch wall gpuprov / baseline (s)",
        "ratio wall",
    ]
    return lines + _table(header, rows) + [""]


def _throughput(results: BenchResults) -> list[str]:
    run = results.throughput
    if run is None:
        return []
    lines = [
        "## Throughput (one worker, zero cloud latency)",
        "",
        f"Fake cloud: {_timing_text(ZERO)}. All jobs submitted at once; each released as soon as "
        "the bench's client sees it ready (one visibility query per 0.2 s). The client runs in "
        "its own process (bench/driver.py), as a service would; the worker runs in the bench "
        "process with the fake cloud, so peak RSS (ru_maxrss) covers worker + fake cloud; the "
        "dev server is a separate process and not counted. CPU: seconds used during the batch "
        "by the bench process (worker + fake cloud), by the dev server and by the client, "
        "per job.",
        "",
    ]
    rows = [_throughput_row("gpuprov", run)]
    if results.floor is not None:
        rows.append(_throughput_row("Temporal floor (bench/floor.py)", results.floor))
    header = [
        "workflow",
        "jobs",
        "done",
        "wall (s)",
        "jobs/s",
        "CPU ms per job: worker / server / client",
        "peak RSS (MiB)",
    ]
    lines += _table(header, rows) + [""]
    floor = results.floor.jobs_per_second if results.floor is not None else None
    if floor and run.jobs_per_second:
        lines += [
            "The floor is a workflow of the happy path's shape doing no work (3 activities to "
            "ready, the ready upsert, the release signal, 1 activity to gone): the most one "
            "worker reaches with a workflow per job on this dev server and these cores. "
            f"gpuprov runs at {run.jobs_per_second / floor:.0%} of it.",
            "",
        ]
    return lines


def _throughput_row(label: str, run: ThroughputRun) -> list[str]:
    done = sum(t.ok for t in run.timings)
    per_job = "-"
    if run.cpu is not None and done:
        cpu = run.cpu
        per_job = " / ".join(
            f"{1000 * part / done:.0f}" for part in (cpu.bench, cpu.server, cpu.driver)
        )
    return [
        label,
        str(run.jobs),
        f"{done}" + (f" ({run.error})" if run.error else ""),
        fmt(run.wall, 1),
        fmt(run.jobs_per_second, 1),
        per_job,
        f"{run.peak_rss_mb:.0f}",
    ]


def _failover(results: BenchResults) -> list[str]:
    lines = [
        "## Failover latency",
        "",
        f"Fake cloud: {_timing_text(OVERHEAD)}; Capacity on create for the cheapest offer(s). "
        "Clock: a FakeCloud subclass timestamps each call. From the create call's Capacity error "
        "to the next offer's create call. Policy for Capacity: tear down (delete + confirm "
        "gone + cleanup of side resources), block the offer, next offer; 'teardown' runs from "
        "the error to the end of the failed VM's last teardown call.",
        "",
    ]
    rows = []
    for run in results.failover:
        samples = run.samples
        rows.append(
            [
                str(run.failovers),
                str(len(samples)) + (f" ({run.error})" if run.error else ""),
                _stat(samples, lambda s: s.total),
                _stat(samples, lambda s: s.teardown),
                _stat(samples, lambda s: s.teardown_cloud),
                _stat(samples, lambda s: s.after_teardown),
            ]
        )
    header = [
        "stockouts per job",
        "samples",
        "error→next create p50 / max (s)",
        "teardown p50 / max",
        "of which in cloud calls",
        "after teardown p50 / max",
    ]
    return lines + _table(header, rows) + [""]


def _stat(samples: list[FailoverSample], pick: Callable[[FailoverSample], float]) -> str:
    values = [pick(sample) for sample in samples]
    return f"{fmt(percentile(values, 50))} / {fmt(max(values, default=None))}"


def _api_calls(results: BenchResults) -> list[str]:
    lines = [
        "## Cloud API calls",
        "",
        "Per provisioned node: every call in the fake cloud's ledger over the batch, divided by "
        "the jobs (one node each). Polls depend on the configured timings (boot 1 s, poll 0.25 s).",
        "",
    ]
    rows = []
    for run in results.overhead:
        nodes = max(1, run.jobs)
        breakdown = ", ".join(f"{k} {v / nodes:.1f}" for k, v in sorted(run.calls.items()))
        rows.append(
            [
                str(run.jobs),
                f"{sum(run.calls.values()) / nodes:.1f}",
                breakdown,
                f"{sum(run.baseline_calls.values()) / nodes:.1f}",
            ]
        )
    lines += _table(["jobs", "gpuprov calls/node", "by primitive", "baseline calls/node"], rows)
    lines += [
        "",
        "Observe and list calls per (provider, region) per poll interval, all jobs waiting in one "
        f"region for machines that never finish booting ({_timing_text(WAITING)}). Jobs arrive "
        f"in waves of {WAVE}; the count starts once every create has returned. `list` is the "
        "shared region-wide call of observe coalescing, `observe` the per-VM call (a wait "
        "without coalescing, or the teardown of a job that failed meanwhile).",
        "",
    ]
    rows = [
        [
            str(run.jobs),
            fmt(run.window, 1),
            str(run.observe),
            str(run.list),
            fmt(run.per_interval),
            str(run.still_waiting) + (f" ({run.error})" if run.error else ""),
        ]
        for run in results.observe
    ]
    header = ["jobs waiting", "window (s)", "observe", "list", "per poll interval", "still waiting"]
    return lines + _table(header, rows) + [""]


def _history(results: BenchResults) -> list[str]:
    rows = []
    happy = [r for r in results.overhead if r.jobs == 1 and r.gpuprov]
    if happy:
        job = happy[0].gpuprov[0]
        rows.append(["single node, happy path (1 job)", str(job.events), str(job.history_bytes)])
    every = [t for r in results.overhead for t in r.gpuprov if t.ok]
    if every:
        rows.append(
            [
                "single node, largest over all overhead runs",
                str(max(t.events for t in every)),
                str(max(t.history_bytes for t in every)),
            ]
        )
    for run in results.failover:
        if run.timings:
            events = max(t.events for t in run.timings)
            size = max(t.history_bytes for t in run.timings)
            rows.append([f"{run.failovers} failover(s), largest", str(events), str(size)])
    lines = ["## History per job", "", "`len(fetch_history().events)` and `len(to_json())`.", ""]
    return lines + _table(["job", "events", "bytes"], rows) + [""]


# ---------------------------------------------------------------- the document


def render(results: BenchResults) -> str:
    mode = "quick" if results.quick else "full"
    lines = [
        f"# gpuprov benchmark ({mode})",
        "",
        f"Command: `{results.command}`; {results.machine}; ran {results.duration:.0f} s; "
        f"peak RSS of the bench process (worker in-process) {results.peak_rss_mb:.0f} MiB"
        + (
            f"; 1-minute load average {results.load[0]:.1f} at start, {results.load[1]:.1f} at "
            "end (anything above ~1 at start means other work shared the cores)."
            if results.load
            else "."
        ),
        "",
        "## Targets",
        "",
    ]
    rows = [[name, measured, verdict] for name, measured, verdict in targets(results)]
    lines += _table(["target", "measured", ""], rows) + [""]
    for section in (_overhead, _limit, _throughput, _failover, _api_calls, _history):
        lines += section(results)
    lines += heartbeat_report.section(results.heartbeats)
    lines += api_failover_report.section(results.api_failover)
    lines += handover_report.section(results.handover)
    lines += billed_idle_report.section(results.overhead, results.handover)
    lines += scarcity_report.section(results.scarcity)
    return "\n".join(lines).rstrip() + "\n"
