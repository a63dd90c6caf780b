"""The run phase's pure judgements (workflows/running.py), without a server: what makes a node
lost (a reclaim notice, a lapsed lease, silence, a broken GPU, never a maintenance that keeps
the machine), when a new attempt's work may start after a restart (`work_fence`), and the
attempt number each node's work is given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuprov.models import (
    JobSpec,
    NodeInstance,
    NodeNotice,
    NodeWork,
    WorkerLiveness,
    WorkState,
)
from workflows import running

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
RECLAIM = NodeNotice(
    kind="reclaim",
    source="ec2",
    action="terminate",
    deadline=T0 + timedelta(minutes=2),
    detail="EC2 spot instance-action: terminate at 2026-12-02T12:02:00Z",
)


def worker(worker_id: str = "w0", **changes: object) -> WorkerLiveness:
    values: dict[str, object] = {
        "worker_id": worker_id,
        "vm": f"vm-{worker_id}",
        "origin": "managed",
        "state": "busy",
        "liveness": "alive",
        "health": "healthy",
    }
    return WorkerLiveness.model_validate(values | changes)


def work(worker_id: str = "w0", state: WorkState = WorkState.STARTED, **changes: object):
    values: dict[str, object] = {
        "rank": 0,
        "vm": f"vm-{worker_id}",
        "worker_id": worker_id,
        "state": state,
    }
    return NodeWork.model_validate(values | changes)


def node(worker_id: str, status: str) -> NodeInstance:
    return NodeInstance(
        attempt=1, node_index=0, vm=f"vm-{worker_id}", provider="fake", region="r", status=status
    )


def test_a_reclaim_notice_makes_the_node_lost_as_reclaimed_even_after_its_work_was_stopped():
    workers = [worker(notice=RECLAIM)]
    for state, code in ((WorkState.STARTED, None), (WorkState.EXITED, -15)):
        judgement = running.judge([work(state=state, exit_code=code)], [], running.lost(workers))
        assert isinstance(judgement, running.Lost) and judgement.reclaimed
        assert "spot reclaimed" in judgement.cause and "terminate at" in judgement.cause
    # a work that completed before the notice is complete
    done = running.judge([work(state=WorkState.EXITED, exit_code=0)], [], running.lost(workers))
    assert isinstance(done, running.Completed)


@pytest.mark.parametrize(
    ("action", "kind", "lost"),
    [
        ("TERMINATE_ON_HOST_MAINTENANCE", "maintenance", True),  # GPUs cannot live-migrate
        ("MIGRATE_ON_HOST_MAINTENANCE", "maintenance", False),
        ("system-reboot", "maintenance", False),  # scheduled days ahead: shown, not acted on
        ("recommendation", "rebalance", False),
    ],
)
def test_only_a_notice_that_ends_the_machine_makes_a_node_lost(action: str, kind: str, lost: bool):
    notice = NodeNotice(kind=kind, source="gce", action=action)  # type: ignore[arg-type]
    reasons = running.lost([worker(notice=notice)])
    assert ("w0" in reasons) is lost
    judgement = running.judge([work()], [], reasons)
    assert isinstance(judgement, running.Lost if lost else running.Running)
    if lost:
        assert not judgement.reclaimed and "maintenance stops the machine" in judgement.cause


def test_a_work_its_node_stopped_when_its_lease_lapsed_is_a_lost_node_not_a_failure():
    stopped = work(state=WorkState.EXITED, exit_code=-15, lease_lapsed=True)
    judgement = running.judge([stopped], [], {})
    assert isinstance(judgement, running.Lost) and not judgement.reclaimed
    assert "lease lapsed" in judgement.cause and "node 0 (vm-w0)" in judgement.cause
    failed = running.judge([work(state=WorkState.EXITED, exit_code=-15)], [], {})
    assert isinstance(failed, running.Failed)


def test_the_new_attempts_work_waits_for_every_old_node_that_may_still_run_it():
    ends = {"cut": T0 + timedelta(seconds=50), "gone": T0 + timedelta(seconds=90)}
    workers = [
        worker("cut", state="revoked", work_ends_by=ends["cut"]),  # its delete failed
        worker("gone", state="revoked", work_ends_by=ends["gone"]),  # confirmed gone
        worker("ended", state="revoked", work_ends_by=T0 + timedelta(hours=1)),  # it reported
        worker("older", state="revoked"),  # never heartbeat with a lease
    ]
    nodes = [node("cut", "leaked"), node("gone", "terminated"), node("ended", "leaked")]
    fence = running.work_fence(workers, nodes, ended={"ended"})
    assert fence == ends["cut"] + running.FENCE_MARGIN
    assert running.work_fence(workers[1:], nodes, ended={"ended"}) is None


def test_each_attempts_work_is_told_its_attempt_number():
    spec = JobSpec.model_validate(
        {"name": "train", "resources": {"gpu": "H100"}, "run": "python train.py"}
    )
    placed = [running.PlacedNode(rank=0, worker_id="w0", vm="vm-w0", address="10.0.0.1")]
    first = running.assignments(spec, placed)
    third = running.assignments(spec, placed, attempt=3)
    assert first[0].command.env["GPUPROV_ATTEMPT"] == "1"
    assert third[0].command.env["GPUPROV_ATTEMPT"] == "3"


def test_a_node_the_cloud_takes_back_is_waited_for_its_stop_until_the_clouds_deadline():
    reclaimed = worker("taken", notice=RECLAIM)
    silent = worker("silent", liveness="lost")
    assert running.unreachable([reclaimed, silent], []) == {"silent"}  # it still reports
    assert running.taken_back_by([reclaimed, silent]) == RECLAIM.deadline
    assert running.taken_back_by([silent]) is None
