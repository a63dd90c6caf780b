"""The chaos harness (chaos/, docs/reliability.md) in its small CI configuration: 8 jobs with the
every-kind fault deck, one worker SIGKILL, one dev server restart, one reconcile pass; among the
jobs a hostile raw start (an impostor named like a real job), two jobs that run (one has a node
killed with a restart left, one a node that exits 3) and two cancels at chosen points.

It runs as a subprocess, as `make chaos` does: its own Temporal dev server on a database file,
its own worker process, its own API. Only outcomes are asserted (exit status, the summary's
verdict lines and the cloud's ledger), never durations.

Seed 2261 is chosen so that every rule of the deck can fire whatever the interleaving: the
global plan rule is Transient (a retried plan, not a failed job), no job has two rules on its
first create or a prepare failure that would stop a create rule, and the cancels are at points
a job reaches after its creates (registering and releasing). The killed job and the impostor's
real job have no rule that aborts them, so the kill and the impostor happen. Coverage is
asserted from the rules that FIRED (the cloud's ledger), never from the plan. A Credentials
fault on chaos-0004's teardown observe leaves its machines as recorded orphans: the ledger shows
them live before the reconcile pass and gone after it.

Usually about 30-60 s; the deadline is wide for a machine that is busy.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from chaos.__main__ import parse
from chaos.checks import overlapping_runs
from chaos.faults import Timings
from chaos.mix import Role, Work
from chaos.nodes import Interval, Run, WorkLog, work_intervals
from chaos.plan import JobRun, make_plan
from chaos.runs import judge_runs
from gpuprov.models import JobState, JobStatus
from providers.fake import FakeCloudState
from providers.fake.state import AgentLease, InstanceRow

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    *("--jobs", "8", "--seed", "2261", "--kills", "1", "--server-restarts", "1"),
    *("--cancel-fraction", "0.25", "--run-fraction", "0.25", "--hostile-fraction", "0.125"),
]


def _line(summary: str, label: str) -> str:
    """The rest of the summary line that starts (after indentation) with `label`."""
    found = re.search(rf"^\s*{re.escape(label)}(.*)$", summary, re.M)
    assert found, f"no line {label!r} in the summary"
    return found.group(1)


def test_the_ci_plan_has_every_role() -> None:
    """What the seed gives the CI run: a hostile impostor, a kill with a restart left, a
    non-zero exit, and two cancels at points reached after the creates."""
    options, _ = parse(SMALL)
    roles = {job.name: job.role for job in make_plan(options, Timings()).jobs}
    assert roles["chaos-0007"].impersonates == "chaos-0005"
    assert roles["chaos-0000"].work == Work("kill", rank=0, after=3.57, max_restarts=1)
    work = roles["chaos-0001"].work
    assert work is not None and (work.ending, work.code) == ("exit", 3)
    assert {roles["chaos-0004"].cancel_at, roles["chaos-0006"].cancel_at} == {
        "releasing",
        "registering",
    }


def test_a_run_verdict_fails_a_killed_job_that_ran_its_work_once() -> None:
    """The check can fail: a job killed with a restart left that completed with its work
    started only once breaks the promise."""
    job = JobRun("chaos-0000", 1, 0.0, role=Role("run", work=Work("kill", max_restarts=1)))
    job.handle, job.state = cast(Any, object()), "completed"
    job.final = JobStatus(name=job.name, state=JobState.COMPLETED)
    log = WorkLog(starts=[(0, 0)], kill=(0, 0, "chaos-0000-a1-n0-abc123", ("fake-i-1",)))
    check = judge_runs([job], {job.name: log}, {}, seed=1)
    assert check is not None and not check.ok
    assert any("not twice each" in line for line in check.detail), check.detail


def test_a_node_cut_off_before_its_job_was_placed_is_judged_by_the_provisioning_deadline() -> None:
    """On a busy machine a partition can land while the job still provisions: failing by its
    provisioning timeout is then right; failing for anything else, or completing, is not."""
    work = Work("partition", max_restarts=0, partition="last", cut_after=2.0)
    lease = AgentLease("i0", "chaos-0002-a1-n0-x", 110.0, None, 109.0, 60.0, None, None, None)

    def judged(error: str) -> list[str]:
        job = JobRun("chaos-0002", 1, 0.0, role=Role("run", work=work))
        job.handle, job.state = cast(Any, object()), "failed"
        job.final = JobStatus(name=job.name, state=JobState.FAILED, error=error)
        check = judge_runs([job], {job.name: WorkLog()}, {}, seed=1, partitions={job.name: [lease]})
        assert check is not None
        return check.detail

    assert judged("provisioning timed out after 120s; instances released.") == []
    assert judged("aborted by Credentials: no") != []


def test_the_overlap_check_fails_a_new_epoch_started_before_a_cut_off_node_stopped() -> None:
    """The check can fail: a partitioned node's work ran on (its lease not over) while the next
    epoch's started; one that started after it had stopped passes, the margin reported."""
    cut_off = Interval(0, 0, start=100.0, end=172.0, how="cut off", cut=True)
    given_up = Interval(0, 1, start=100.0, end=150.0, how="given up")
    early = {"chaos-0001": [cut_off, given_up, Interval(1, 0, 160.0, 163.0, "exited")]}
    check = overlapping_runs(early, planned=1, seed=1, epoch_start=100.0)
    assert not check.ok and len(check.detail) == 1, check.detail
    assert "epoch 0 node 0 (cut off, ran until t+72.0s)" in check.detail[0]
    assert "ran 3.0s at once" in check.detail[0]
    late = {"chaos-0001": [cut_off, given_up, Interval(1, 0, 182.5, 185.0, "exited")]}
    check = overlapping_runs(late, planned=1, seed=1, epoch_start=100.0)
    assert check.ok, check.detail
    assert "1 cut off while running their work" in check.value
    assert "started +10.5s after such a node's work had stopped" in check.value
    endless = {"chaos-0001": [Interval(0, 0, 100.0, None, "no end known"), late["chaos-0001"][2]]}
    assert not overlapping_runs(endless, planned=0, seed=1, epoch_start=100.0).ok


def test_a_cut_off_nodes_work_runs_until_its_lease_and_grace_or_its_machine_end() -> None:
    """The intervals the overlap check reads: a cut-off node's work runs to the stop its agent
    recorded; a work given up without a report, to the moment seen plus a heartbeat and the
    grace, or its machine's end if sooner; a reported exit, to the report."""
    vms = ["chaos-0001-a1-n0-x", "chaos-0001-a1-n1-x", "chaos-0001-a2-n0-x"]
    log = WorkLog(
        runs={
            "w0": Run(0, 0, vms[0], started=100.0, given_up=130.0),
            "w1": Run(0, 1, vms[1], started=100.0, given_up=130.0),
            "w2": Run(1, 0, vms[2], started=180.0, ended=183.0, how="exited"),
        },
        cut={"w0"},
    )
    lease = AgentLease("i0", vms[0], 110.0, None, 109.0, 60.0, "w0", 2.0, 171.0)
    machines = [
        InstanceRow("i1", vms[1], "r1", None, "o", "gpu8", "normal", 90.0, deleted_at=131.0)
    ]
    spans = work_intervals(log, machines, [lease], delete_delay=0.3, hears_within=4.0)
    assert [(s.epoch, s.rank, s.end, s.how, s.cut) for s in spans] == [
        (0, 0, 171.0, "cut off", True),
        (0, 1, 131.3, "machine gone", False),
        (1, 0, 183.0, "exited", False),
    ]


def test_small_chaos_run_keeps_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "chaos.md"
    run = subprocess.run(
        [sys.executable, "-m", "chaos", *SMALL, "--deadline", "420", "--out", str(out), "--keep"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = run.stdout
    kept = re.search(r"^run directory kept: (.+)$", summary, re.M)
    try:
        assert run.returncode == 0, f"{summary}\n--- stderr (tail) ---\n{run.stderr[-4000:]}"
        assert kept, summary
        _assert_summary(summary)
        _assert_roles(summary, run.stderr)
        _assert_orphans_were_live_then_gone(summary, Path(kept.group(1)))
    finally:
        if kept:
            shutil.rmtree(kept.group(1), ignore_errors=True)

    report = out.read_text()
    assert "| creates per VM identity (must be exactly 1) | PASS |" in report
    assert "**FAIL**" not in report


def _assert_summary(summary: str) -> None:
    assert "RESULT: PASS" in summary
    assert "[PASS] every job reached a terminal state: 8/8" in summary
    assert "[PASS] creates per VM identity (must be exactly 1):" in summary
    assert "[PASS] live instances after release and one reconcile pass (must be 0): 0" in summary
    assert "[PASS] live side resources after one reconcile pass (must be 0): 0" in summary
    assert "[PASS] open orphans after one reconcile pass (must be 0): 0" in summary
    assert "worker SIGKILLs 1/1, dev server restarts 1/1" in summary
    assert "reconcile pass: ran" in summary
    # The every-kind deck FIRED (the cloud's ledger): every effect, every primitive and every
    # ErrorKind was injected into a call, not merely planned.
    assert _line(summary, "every-kind deck: ").startswith("12/12 fired"), summary
    effects = _line(summary, "fired by effect: ")
    for effect in ("bad_runtime", "boot_failed", "boot_hang", "delay", "error", "lost_response"):
        assert f"{effect} " in effects
    primitives = _line(summary, "fired by primitive: ")
    for primitive in ("plan", "prepare", "create", "observe", "list", "delete", "cleanup"):
        assert f"{primitive} " in primitives
    kinds = _line(summary, "fired error/lost_response kinds: ")
    for kind in ("Transient", "Capacity", "Quota", "Unavailable", "Failed", "InvalidRequest"):
        assert f"{kind} " in kinds
    assert "Credentials " in kinds


def _assert_roles(summary: str, progress: str) -> None:
    """The hostile start, the cancels and the jobs that run kept their promises, and each
    happened as planned (not merely "nothing went wrong because nothing happened")."""
    hostile = _line(summary, "[PASS] hostile starts: ")
    assert "impostor named chaos-0005 under job-chaos-0007" in hostile, hostile
    assert "an impostor failed while it was ready" in _line(summary, "chaos-0005 completed")
    cancels = _line(summary, "[PASS] cancels at chosen points: ")
    points = re.search(r"sent at: ([^;]*);", cancels)
    assert points and len(points.group(1).split(", ")) >= 2, cancels
    assert "outcomes: cancelled 2" in cancels, cancels
    runs = _line(summary, "[PASS] jobs that run: ")
    assert "killed, restarted on another offer 1" in runs, runs
    assert "node 0 exited 3 1" in runs, runs
    assert "killed node 0 of chaos-0000" in progress


def _assert_orphans_were_live_then_gone(summary: str, run_dir: Path) -> None:
    """Every orphan open before the pass was resolved by it, and at least one was a machine the
    ledger showed live before the pass and gone after (not a record of nothing)."""
    counts = re.search(
        r"^orphans the pass resolved: (\d+) of (\d+); "
        r"their machines live before it and gone after: (\d+)$",
        summary,
        re.M,
    )
    assert counts, summary
    resolved, open_before, machines = (int(n) for n in counts.groups())
    assert resolved == open_before >= 1
    assert machines >= 1
    live_before = re.findall(
        r"^\s+(chaos-\S+): machine (.+) live before the pass; gone after$", summary, re.M
    )
    assert len(live_before) == machines, summary
    # The ledger agrees: each such instance carries the orphan's VM identity and is deleted now.
    state = FakeCloudState(str(run_dir / "fake-cloud.db"))
    try:
        rows = {row.id: row for row in state.instances()}
    finally:
        state.close()
    for vm, ids in live_before:
        for instance_id in ids.split(", "):
            assert rows[instance_id].vm == vm
            assert rows[instance_id].deleted_at is not None, (vm, instance_id)
