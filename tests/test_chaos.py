"""The chaos harness (chaos/, docs/reliability.md) in its small CI configuration: 6 jobs with the
every-kind fault deck, one worker SIGKILL, one dev server restart, one reconcile pass.

It runs as a subprocess, as `make chaos` does: its own Temporal dev server on a database file,
its own worker process, its own API. Only outcomes are asserted (exit status, the summary's
verdict lines and the cloud's ledger), never durations.

Seed 5043 is chosen so that every rule of the deck can fire whatever the interleaving: the
global plan rule is Transient (a retried plan, not a failed job), no job has a prepare failure
that would stop its create rules, and the cancelled job arrives after the disruptions. Coverage
is asserted from the rules that FIRED (the cloud's ledger), never from the plan. An
InvalidRequest on chaos-0003's teardown observe leaves its machines as recorded orphans: the
ledger shows them live before the reconcile pass and gone after it.

Usually about a minute; if the kill happens to strand a non-heartbeating activity (prepare,
cleanup, delete, plan) the job waits out its start-to-close timeout, so the deadline is wide.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from providers.fake import FakeCloudState

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--jobs", "6", "--seed", "5043", "--kills", "1", "--server-restarts", "1"]


def _line(summary: str, label: str) -> str:
    """The rest of the summary line that starts (after indentation) with `label`."""
    found = re.search(rf"^\s*{re.escape(label)}(.*)$", summary, re.M)
    assert found, f"no line {label!r} in the summary"
    return found.group(1)


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
        _assert_orphans_were_live_then_gone(summary, Path(kept.group(1)))
    finally:
        if kept:
            shutil.rmtree(kept.group(1), ignore_errors=True)

    report = out.read_text()
    assert "| creates per VM identity (must be exactly 1) | PASS |" in report
    assert "**FAIL**" not in report


def _assert_summary(summary: str) -> None:
    assert "RESULT: PASS" in summary
    assert "[PASS] every job reached a terminal state: 6/6" in summary
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
