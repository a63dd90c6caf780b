"""The chaos harness with two worker processes on PostgreSQL (`--workers 2 --database
postgresql`, docs/reliability.md): the plan sends kills to each worker in turn, and a small run
(its own PostgreSQL server, each worker with its own data dir, each SIGKILLed on its own) keeps
every promise, with both workers polling the jobs' task queue (which one runs a job is Temporal's
choice, and four jobs can all land on one). Only outcomes are asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chaos.__main__ import parse
from chaos.faults import Timings
from chaos.plan import make_plan

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--jobs", "4", "--seed", "12", "--kills", "2", "--server-restarts", "1"]


def test_kills_go_to_every_worker_and_one_worker_keeps_its_plan() -> None:
    one, _ = parse(["--jobs", "40", "--seed", "3"])
    two, _ = parse(["--jobs", "40", "--seed", "3", "--workers", "2", "--database", "postgresql"])
    assert (one.kills, two.kills) == (2, 2)
    alone, pair = make_plan(one, Timings()), make_plan(two, Timings())

    def without_target(plan):  # type: ignore[no-untyped-def]
        return [(d.at, d.action, d.pause, d.signal) for d in plan.disruptions]

    assert without_target(alone) == without_target(pair)
    assert {d.worker for d in alone.disruptions} == {0}
    kills = [d.worker for d in pair.disruptions if d.action == "kill_worker"]
    assert sorted(kills) == [0, 1]
    three, _ = parse(["--jobs", "4", "--workers", "3"])
    assert three.kills == 3, "by default every worker is killed at least once"


def test_two_workers_on_postgresql_keep_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "chaos.md"
    run = subprocess.run(
        [sys.executable, "-m", "chaos", *SMALL, "--workers", "2", "--database", "postgresql"]
        + ["--deadline", "420", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = run.stdout
    assert run.returncode == 0, f"{summary}\n--- stderr (tail) ---\n{run.stderr[-4000:]}"

    assert "RESULT: PASS" in summary
    assert "[PASS] every job reached a terminal state: 4/4" in summary
    assert "[PASS] creates per VM identity (must be exactly 1):" in summary
    assert "[PASS] live instances after release and one reconcile pass (must be 0): 0" in summary
    assert "[PASS] open orphans after one reconcile pass (must be 0): 0" in summary
    assert "worker SIGKILLs 2/2, dev server restarts 1/1" in summary
    check = "every worker process polled the jobs' task queue, and ran tasks of them in a run"
    assert f"[PASS] {check} big enough to spread: polled: worker 1, worker 2;" in summary
    assert "SIGKILL worker 1 #" in run.stderr and "SIGKILL worker 2 #" in run.stderr
    assert "PostgreSQL database chaos_" in run.stderr
    assert "**FAIL**" not in out.read_text()
