"""The node agent runs its node's work (`agent.pyz run`, the real process, installed alone and
run `-I -S` as on a node) against the real API over HTTP and a real database: setup then run
under /bin/sh in a process group of its own, the output sent in order, the end reported with
the last lines; never the same work twice, even across a restart of the agent; a lost control
plane never stops the work within the node's lease (test_agent_lease.py: past it); a stop is
SIGTERM, the grace period, then SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import JobsSettings, WorkersSettings
from gpuprov.models import WorkState
from gpuprov.node.credentials import CREDENTIAL_FILE
from gpuprov.node.processes import WORK_MARK
from gpuprov.node.work import NOTICE_ENV
from gpuprov.node.workdir import (
    ASSIGNMENT_FILE,
    CURSOR_FILE,
    NOTICE_FILE,
    PID_FILE,
    WORK_SUBDIR,
)
from gpuprov.store.logs import Lines, LogRecords
from gpuprov.store.records import Records
from gpuprov.store.work import Assignment, RunCommand, WorkRecords
from tests.gpuprov.test_agent_run import PYTHONS, Daemon, install, join_env, start, stop, until
from tests.gpuprov.test_api import JOB, VM, vm_token

FAST = WorkersSettings(heartbeat_interval_seconds=0.2, lost_after_seconds=2)
JOBS = JobsSettings(stop_grace_seconds=1.5)

pytestmark = [
    pytest.mark.slow,  # measured: docs/testing.md, "The fast lane"
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]


@asynccontextmanager
async def api_on(
    records: Records, port: int, workers: WorkersSettings = FAST
) -> AsyncIterator[str]:
    async with serving(create_app(records, workers=workers, jobs=JOBS), "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}"


@asynccontextmanager
async def node(
    records: Records, tmp_path: Path, python: str = sys.executable
) -> AsyncIterator[tuple[Daemon, str, int]]:
    """A registered node: its agent, its worker id and the API's port."""
    root = tmp_path / "node"
    install(root / "bin")
    token, port = vm_token(records), free_port()
    async with api_on(records, port) as url:
        daemon = start(root, python, "--token-file", str(join_env(root, url, token)))
        try:
            found = await until(lambda: records.workers_of_vms([VM]), "registration")
            [worker_id] = [row.id for row in found.values()]
            # The row is written before the agent has its answer and saves the credential.
            kept = daemon.state_dir / CREDENTIAL_FILE
            await until(kept.exists, "the credential kept")  # written aside, then renamed
            yield daemon, worker_id, port
        finally:
            stop(daemon)


def assign(records: Records, worker_id: str, run: str, setup: str | None = None) -> str:
    """Give the node its work (rank 0 of epoch 0); the work's id."""
    command = RunCommand(setup=setup, run=run, env={"GPUPROV_NODE_RANK": "0", "GREETING": "hi"})
    work = WorkRecords(records.db)
    work.assign(JOB, 0, [Assignment(rank=0, worker_id=worker_id, command=command)])
    row = work.for_worker(worker_id)
    assert row is not None
    return row.id


def state(records: Records):
    [row] = WorkRecords(records.db).of_job(JOB, 0)
    return row


def ended(records: Records):
    row = state(records)
    return row if row.state.final else None


def output(records: Records) -> list[tuple[str, str]]:
    lines = Lines()
    found = lines.feed(LogRecords(records.db).chunks(JOB).chunks) + lines.flush()
    return [(line.stream, line.text) for line in found]


def gone(pid: int) -> bool:
    """No process of the group `pid` is left (a zombie waiting for its reaper counts as gone)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(stat[2]) == pid and stat[0] != "Z":
                return False
    return True


def work_dir(daemon: Daemon, work_id: str) -> Path:
    return daemon.state_dir / WORK_SUBDIR / work_id


@pytest.mark.parametrize("python", sorted(PYTHONS))
async def test_setup_then_run_their_output_in_order_and_the_end_with_its_last_lines(
    records, tmp_path, python
):
    script = 'echo "rank $GPUPROV_NODE_RANK says $GREETING"; echo oops >&2; env; exit 0'
    async with node(records, tmp_path, PYTHONS[python]) as (daemon, worker_id, _):
        credential = (daemon.state_dir / CREDENTIAL_FILE).read_text().strip()
        work_id = assign(records, worker_id, script, setup="echo setting up; printf 'a\\nb'")
        row = await until(lambda: ended(records), "the work's end")
        assert (row.state, row.exit_code) == (WorkState.EXITED, 0), daemon.log
        assert "rank 0 says hi" in (row.tail or "")
        await until(lambda: ("stdout", "ab") not in output(records), "all the output")
        lines = output(records)
        stdout = [text for stream, text in lines if stream == "stdout"]
        # In order per stream (across the two, as the pipes were read).
        assert stdout[:3] == ["setting up", "a", "brank 0 says hi"]  # setup ended mid-line
        assert [text for stream, text in lines if stream == "stderr"] == ["oops"]
        env = dict(text.split("=", 1) for text in stdout[3:] if "=" in text)
        assert env["GREETING"] == "hi" and env["GPUPROV_NODE_RANK"] == "0"
        shell_own = {"PWD", "OLDPWD", "SHLVL", "_", "LC_CTYPE"}  # LC_CTYPE: PEP 538
        assert set(env) - shell_own == {
            "PATH",
            "HOME",
            "GPUPROV_NODE_RANK",
            "GREETING",
            WORK_MARK,
            NOTICE_ENV,
        }
        assert env[WORK_MARK] == work_id  # how its processes are found without a cgroup
        # where the cloud's notice would go: in the work's own directory, not there yet
        assert env[NOTICE_ENV] == str(work_dir(daemon, work_id) / NOTICE_FILE)
        assert credential not in json.dumps(lines)
        # The agent reports the end first and then removes the directory (a crash between
        # the two re-reports it), so the removal follows the row by a moment.
        await until(lambda: not work_dir(daemon, work_id).exists(), "its directory removed")
        assert credential not in daemon.log


async def test_setup_failing_is_the_exit_and_run_never_starts(records, tmp_path):
    async with node(records, tmp_path) as (daemon, worker_id, _):
        assign(records, worker_id, "echo never", setup="echo installing; exit 4")
        row = await until(lambda: ended(records), "the work's end")
    assert (row.state, row.exit_code) == (WorkState.EXITED, 4)
    assert "installing" in row.tail and "setup exited 4; run did not start" in row.tail
    assert ("stdout", "never") not in output(records)


async def test_a_restarted_agent_never_starts_the_work_again(records, tmp_path):
    starts = tmp_path / "starts"
    script = f"echo started >> {starts}; echo first; sleep 2; echo second"
    async with node(records, tmp_path) as (daemon, worker_id, _):
        work_id = assign(records, worker_id, script)
        await until(lambda: starts.exists() and state(records).state is WorkState.STARTED, "start")
        stop(daemon)  # the agent dies (SIGKILL); the work, in its own process group, goes on
        restarted = start(daemon.root, sys.executable)
        try:
            row = await until(lambda: ended(records), "the work's end", timeout=60)
        finally:
            stop(restarted)
    assert (row.state, row.exit_code) == (WorkState.EXITED, 0), restarted.log
    assert starts.read_text() == "started\n"  # once
    assert [text for _, text in output(records)] == ["first", "second"]
    assert f"work {work_id}: known from before a restart" in restarted.log


async def test_an_outage_within_the_lease_never_stops_the_work_and_every_report_arrives(
    records, tmp_path
):
    done = tmp_path / "done"
    script = (
        f"for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; sleep 0.3; done; touch {done}; exit 7"
    )
    root = tmp_path / "node"
    install(root / "bin")
    token, port = vm_token(records), free_port()
    # a lease far longer than the outage: the work goes on through it
    within = FAST.model_copy(update={"lease_seconds": 600.0})
    async with api_on(records, port, within) as url:
        daemon = start(root, sys.executable, "--token-file", str(join_env(root, url, token)))
        found = await until(lambda: records.workers_of_vms([VM]), "registration")
        [worker_id] = [row.id for row in found.values()]
        assign(records, worker_id, script)
        await until(lambda: state(records).state is WorkState.STARTED, "the start")
    try:
        await until(done.exists, "the work's end while the API is down")
        assert state(records).state is WorkState.STARTED
        async with api_on(records, port, within):
            row = await until(lambda: ended(records), "the reports, once the API is back")
            await until(lambda: len(output(records)) == 10, "all the output")
    finally:
        stop(daemon)
    assert (row.state, row.exit_code) == (WorkState.EXITED, 7)
    assert output(records) == [("stdout", f"line {i}") for i in range(1, 11)]
    assert "heartbeat failed" in daemon.log and "failed (1 in a row)" in daemon.log
    assert not row.lease_lapsed and "within the lease" not in daemon.log


async def test_a_stop_is_sigterm_then_sigkill_after_the_grace_period(records, tmp_path):
    script = "trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.1; done"
    async with node(records, tmp_path) as (daemon, worker_id, _):
        work_id = assign(records, worker_id, script)
        await until(lambda: ("stdout", "ready") in output(records), "the work running")
        kept = work_dir(daemon, work_id)
        pid = int((kept / PID_FILE).read_text())
        assert not gone(pid)
        assert kept.stat().st_mode & 0o777 == 0o700
        for name in (ASSIGNMENT_FILE, "stdout", "stderr", CURSOR_FILE):
            assert (kept / name).stat().st_mode & 0o777 == 0o600, name
        WorkRecords(records.db).request_stop(JOB, 0)
        row = await until(lambda: ended(records), "the stop reported")
        assert gone(pid)
    assert (row.state, row.exit_code) == (WorkState.STOPPED, -signal.SIGKILL)
    assert "got TERM" in row.tail and "killed after the 1.5s grace period" in row.tail
    assert "SIGTERM, SIGKILL in 1.5s" in daemon.log


async def test_work_that_ends_on_sigterm_is_reported_stopped_at_once(records, tmp_path):
    async with node(records, tmp_path) as (daemon, worker_id, _):
        work_id = assign(records, worker_id, "sleep 3600 & wait")
        await until(lambda: (work_dir(daemon, work_id) / PID_FILE).exists(), "the start")
        pid = int((work_dir(daemon, work_id) / PID_FILE).read_text())
        WorkRecords(records.db).request_stop(JOB, 0)
        row = await until(lambda: ended(records), "the stop reported")
        assert gone(pid)  # the background sleep too: the whole group
    assert (row.state, row.exit_code) == (WorkState.STOPPED, -signal.SIGTERM)
    assert "still running after" not in daemon.log  # no SIGKILL was needed
