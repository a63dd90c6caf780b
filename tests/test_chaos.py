"""The chaos harness (chaos/, docs/reliability.md) in its small CI configuration: 4 jobs with the
every-kind fault deck, one worker SIGKILL, one dev server restart, one reconcile pass.

It runs as a subprocess, as `make chaos` does: its own Temporal dev server on a database file,
its own worker process, its own API. Only outcomes are asserted (exit status and the summary's
verdict lines), never durations. Seed 12 puts a Credentials failure on a job's delete, so its
machine is left as a recorded orphan that the reconcile pass has to delete.

Usually about a minute; if the kill happens to strand a non-heartbeating activity (prepare,
cleanup, delete, plan) the job waits out its start-to-close timeout, so the deadline is wide.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--jobs", "4", "--seed", "12", "--kills", "1", "--server-restarts", "1"]


def test_small_chaos_run_keeps_every_promise(tmp_path: Path) -> None:
    out = tmp_path / "chaos.md"
    run = subprocess.run(
        [sys.executable, "-m", "chaos", *SMALL, "--deadline", "420", "--out", str(out)],
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
    assert "[PASS] live side resources after one reconcile pass (must be 0): 0" in summary
    assert "[PASS] open orphans after one reconcile pass (must be 0): 0" in summary
    assert "worker SIGKILLs 1/1, dev server restarts 1/1" in summary
    assert "reconcile pass: ran" in summary
    # The every-kind deck: every effect, every primitive and every ErrorKind was injected.
    for effect in ("bad_runtime", "boot_failed", "boot_hang", "delay", "error", "lost_response"):
        assert f"{effect} " in summary.split("by effect:")[1].splitlines()[0]
    primitives = summary.split("by primitive:")[1].splitlines()[0]
    for primitive in ("plan", "prepare", "create", "observe", "list", "delete", "cleanup"):
        assert f"{primitive} " in primitives
    kinds = summary.split("error/lost_response kinds:")[1].splitlines()[0]
    for kind in ("Transient", "Capacity", "Quota", "Unavailable", "Failed", "InvalidRequest"):
        assert f"{kind} " in kinds
    assert "Credentials " in kinds

    report = out.read_text()
    assert "| creates per VM identity (must be exactly 1) | PASS |" in report
    assert "**FAIL**" not in report
