"""The step table (workflows/steps.py) against what the worker registers: every activity a
worker offers has exactly one row, and nothing is registered that no workflow can schedule."""

from __future__ import annotations

import ast
from pathlib import Path

from temporalio import activity

from gpuprov.engine.worker import build_worker
from gpuprov.policy import Stage
from workflows.steps import STEPS, step_name

WORKFLOWS_DIR = Path(__file__).resolve().parents[2] / "workflows"


def _registered_names(client, tmp_path) -> set[str]:
    from activities.ssh_keys import KeyStore
    from gpuprov.engine.worker import open_records
    from gpuprov.store.ssh_records import SshRecords
    from providers.fake import FakeCloud
    from tests.helpers import fast_cloud

    records = open_records(f"sqlite:///{tmp_path / 'db'}")
    try:
        worker = build_worker(
            client,
            "steps-table",
            {"fake": FakeCloud(fast_cloud())},
            records,
            api_url="http://127.0.0.1:9",
            ssh_keys=KeyStore(SshRecords(records.db), directory=tmp_path / "ssh"),
            ssh_bootstrap={"fake"},
        )
        return set(worker._activity_worker._activities)  # the names the worker polls for
    finally:
        records.db.dispose()


async def test_every_registered_activity_has_one_row_and_every_row_is_registered(client, tmp_path):
    rows = {step_name(fn) for fn in STEPS}
    assert len(rows) == len(STEPS), "two rows for one activity name"
    assert _registered_names(client, tmp_path) == rows


def test_every_row_is_an_activity_definition():
    for fn in STEPS:
        assert activity._Definition.from_callable(fn) is not None, fn


def test_local_steps_are_bookkeeping_and_remote_waits_heartbeat():
    for fn, step in STEPS.items():
        if step.local:
            assert step.stage is Stage.BOOKKEEPING, step_name(fn)
            assert step.heartbeat is None, step_name(fn)  # local activities cannot heartbeat


def test_workflows_schedule_activities_only_through_run_step():
    """No workflow module calls the SDK's execute_*activity* directly: options come from the
    table and nowhere else (steps.py itself is the one caller)."""
    offenders = []
    for path in sorted(WORKFLOWS_DIR.glob("*.py")):
        if path.name == "steps.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and "activity" in node.attr
                and (node.attr.startswith("execute_") or node.attr.startswith("start_"))
            ):
                offenders.append(f"{path.name}:{node.lineno} {node.attr}")
    assert offenders == []


def test_every_remote_step_that_reaches_a_cloud_or_node_heartbeats_within_seconds():
    """A step held by a SIGKILLed worker is handed out again within the heartbeat timeout:
    every remote step but the k3s installers (long SSH commands, their own minute) and the
    liveness sweep (the database only) heartbeats at CALL_HEARTBEAT."""
    from activities.k3s import K3sActivities
    from activities.liveness import LivenessActivities
    from workflows.steps import CALL_HEARTBEAT

    exempt = {K3sActivities.setup_k3s, LivenessActivities.sweep_liveness}
    remote = {fn: step for fn, step in STEPS.items() if not step.local and fn not in exempt}
    assert remote
    slow = {step_name(fn): step.heartbeat for fn, step in remote.items()}
    assert all(beat == CALL_HEARTBEAT for beat in slow.values()), slow
    assert CALL_HEARTBEAT.total_seconds() <= 10
