"""The benchmark harness (bench/) runs end to end at its smallest sizes and renders its report.

No timed assertions: only what is deterministic (every job ends, one create per node, one
failover sample per stockout, the happy path's history size) and that the tables render."""

from __future__ import annotations

import pytest
from temporalio.client import Client

from bench.__main__ import SCENARIOS, Sizes, run_all
from bench.report import render
from bench.scarcity import POLICIES, ScarcitySize
from bench.stats import BenchResults
from bench.targets import MAX_HAPPY_EVENTS

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

ENDED = {"completed", "failed", "cancelled"}
SMALLEST = Sizes(
    overhead=(1, 5),
    observe=(1, 5),
    throughput=5,
    failover_repeats=1,
    triple_failover_repeats=1,
    observe_intervals=2,
    heartbeats=(5, 0.5, 1.5, 1.0),
    scarcity=ScarcitySize(jobs=3, arrival_minutes=2.0, deadline_minutes=15.0),
    handover=2,
)


async def test_bench_smallest_sizes_run_and_render(client: Client) -> None:
    results = BenchResults(command="pytest", machine="test", quick=True)
    # the two-API-process scenario has its own test (tests/test_api_failover.py)
    await run_all(SMALLEST, results, client, tuple(s for s in SCENARIOS if s != "api-failover"))

    assert results.throughput is not None and results.throughput.error is None
    assert results.throughput.timings and all(t.ok for t in results.throughput.timings)
    assert results.floor is not None and results.floor.error is None
    assert results.floor.timings  # the no-work skeleton ends like a job
    assert all(t.ok for t in results.floor.timings)
    for run in results.overhead:
        assert run.error is None
        assert [t.ok for t in run.gpuprov] == [True] * run.jobs
        assert [t.ok for t in run.baseline] == [True] * run.jobs
        assert run.calls["create"] == run.jobs == run.baseline_calls["create"]
        # billed idle: one node a job, both sides, every phase measured and none negative
        assert len(run.idle) == len(run.baseline_idle) == run.jobs
        for node in run.idle + run.baseline_idle:
            assert node.up >= 0 and node.down is not None and node.down >= 0
    happy = results.overhead[0].gpuprov[0]
    assert 0 < happy.events <= MAX_HAPPY_EVENTS, happy.events
    assert [len(run.samples) for run in results.failover] == [1, 3]
    for run in results.observe:
        assert run.error is None and run.still_waiting == run.jobs
        assert run.observe + run.list > 0
    beats = results.heartbeats
    assert beats is not None and beats.error is None, beats
    for phase in (beats.floor, beats.paced, beats.unpaced):
        assert phase is not None and phase.ok == phase.sent > 0 and phase.errors == {}
    assert beats.paced.sent == 5 * 3  # each of 5 agents every 0.5 s for 1.5 s

    assert [run.long_poll for run in results.handover] == [True, False]
    for run in results.handover:
        assert run.error is None and run.state == "completed", run
        assert len(run.handover) == len(run.node_started_after) == 2
        assert run.job_wrote_after is not None and run.job_wrote_after >= 0
        assert len(run.idle) == 2
        for node in run.idle:
            phases = (node.registration, node.placement, node.handover)
            assert None not in phases and node.up == pytest.approx(sum(phases))  # type: ignore[arg-type]

    assert [run.policy for run in results.scarcity] == [policy.name for policy in POLICIES]
    for run in results.scarcity:
        assert all(job.final is not None and job.final.state.value in ENDED for job in run.jobs)
        assert run.leaks == 0  # every machine and side resource gone once every job ended
        assert sum(run.creates.values()) >= len(run.times())

    report = render(results)
    for heading in (
        "## Targets",
        "## Overhead per single-node job",
        "## The limit: gpuprov / plain asyncio loop",
        "## Throughput (one worker, zero cloud latency)",
        "## Failover latency",
        "## Cloud API calls",
        "## History per job",
        "## Heartbeats: one API process",
        "## Heartbeats: two API processes, one killed",
        "## Work hand-over",
        "## Billed idle: GPU-seconds waiting on gpuprov",
        "## Time to GPU when GPUs are scarce",
    ):
        assert heading in report
    assert f"| single node, happy path (1 job) | {happy.events} |" in report
    assert "| Temporal floor (bench/floor.py) | 5 | 5 |" in report
    assert "| one API process holds 1000 nodes at 30 s, < 10% of a core |" in report
