"""The node's lease (gpuprov/node/lease.py): a node cut off from the API for longer than its
lease stops its work (SIGTERM to the process group, the grace period, SIGKILL) and reports the
end, marked `lease_lapsed`, once it reaches the API again; no work starts without a lease; a
restarted agent keeps the lease it had; an API that grants none never stops the work."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gpuprov.cli.dev import free_port
from gpuprov.models import WorkState
from gpuprov.node.lease import Lease
from gpuprov.node.work_runner import WorkRunner
from gpuprov.node.workdir import PID_FILE
from tests.gpuprov.test_agent_run import install, join_env, start, stop, until
from tests.gpuprov.test_agent_work import FAST, JOBS, api_on, assign, ended, gone, state, work_dir
from tests.gpuprov.test_api import VM, vm_token


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_node_cut_off_past_its_lease_stops_its_work_and_reports_it_when_back(
    records, tmp_path
):
    notes = tmp_path / "notes"
    script = (
        f"trap 'echo TERM >> {notes}; exit 3' TERM; echo ready >> {notes}; "
        "while :; do sleep 0.1; done"
    )
    root = tmp_path / "node"
    install(root / "bin")
    token, port = vm_token(records), free_port()
    assert FAST.lease == 2 and JOBS.stop_grace_seconds == 1.5
    async with api_on(records, port) as url:
        daemon = start(root, sys.executable, "--token-file", str(join_env(root, url, token)))
        found = await until(lambda: records.workers_of_vms([VM]), "registration")
        [worker_id] = [row.id for row in found.values()]
        work_id = assign(records, worker_id, script)
        await until(lambda: notes.exists() and "ready" in notes.read_text(), "the work running")
        pid = int((work_dir(daemon, work_id) / PID_FILE).read_text())
    try:
        # The API is gone: within the lease and the grace period the work is stopped.
        await until(lambda: gone(pid), "the work stopped while the node is cut off", timeout=30)
        assert notes.read_text().splitlines() == ["ready", "TERM"]
        assert state(records).state is WorkState.STARTED  # nobody could be told yet
        assert "no answer from the API within the lease" in daemon.log
        async with api_on(records, port):
            row = await until(lambda: ended(records), "the end, once the API is back")
    finally:
        stop(daemon)
    assert (row.state, row.exit_code, row.lease_lapsed) == (WorkState.EXITED, 3, True)
    assert "still running after" not in daemon.log  # the trap ended it: no SIGKILL needed


def test_a_lease_lapses_when_no_heartbeat_was_answered_for_its_length(tmp_path: Path):
    lease = Lease(str(tmp_path))
    assert not lease.may_start() and not lease.lapsed()  # nothing heard yet: no start, no stop
    lease.renew(time.monotonic() - 10, 5.0)  # the last answered heartbeat was sent 10 s ago
    assert lease.lapsed() and not lease.may_start()
    lease.renew(time.monotonic(), 600.0)
    assert lease.may_start() and not lease.lapsed()
    left = lease.left()
    assert left is not None and 590 < left <= 600


def test_a_restarted_agent_keeps_its_lease_and_does_not_grant_itself_a_new_one(tmp_path: Path):
    Lease(str(tmp_path)).renew(time.monotonic() - 10, 5.0)
    restarted = Lease(str(tmp_path))
    assert restarted.lapsed() and not restarted.may_start()
    Lease(str(tmp_path)).renew(time.monotonic(), 600.0)
    assert Lease(str(tmp_path)).may_start()


def test_an_api_that_grants_no_lease_never_stops_the_work(tmp_path: Path):
    lease = Lease(str(tmp_path))
    lease.renew(time.monotonic() - 3600, None)  # an older API: no lease_seconds in its answer
    assert lease.may_start() and not lease.lapsed() and lease.left() is None
    for unreadable in ("5", True, -1):
        lease.renew(time.monotonic() - 3600, unreadable)
        assert not lease.lapsed()


def test_no_work_starts_while_the_lease_is_over(tmp_path: Path):
    calls: list[str] = []
    assignment = {
        "id": "work-1",
        "job": "train",
        "epoch": 0,
        "rank": 0,
        "command": {"run": "true", "env": {}},
        "state": "assigned",
        "stop_grace_seconds": 1,
    }

    def call(path: str, body: dict | None, what: str) -> dict:
        calls.append(path)
        return assignment if path == "/v1/work" else {}

    runner = WorkRunner(call, str(tmp_path))
    answer = {"state": "busy", "work_id": "work-1", "lease_seconds": 5.0}
    runner.heard(answer, 1.0, sent_at=time.monotonic() - 10)  # its lease ended 5 s ago
    runner._step()
    runner._step()
    assert calls == ["/v1/work"]  # read, never reported started
    assert runner.work is not None and not runner.work.spawned
