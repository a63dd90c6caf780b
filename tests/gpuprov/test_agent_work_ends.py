"""A job's processes end with it (`agent.pyz run`, the real process): whatever its work started,
in whatever session (`setsid`, a double fork), is killed once the work's main process has ended
or its stop's grace period is over, before the end is reported; so nothing of one job is left
to read the next job's assignment on the same worker. The agent runs the work in a cgroup v2 of
its own where it can make one, and finds its processes by their mark (GPUPROV_WORK_ID in their
environment) where it cannot (here: the cgroup v2 filesystem mounted read-only)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuprov.models import WorkState
from gpuprov.node.processes import WORK_MARK, sweep
from gpuprov.node.workdir import ASSIGNMENT_FILE, CGROUP_FILE, PID_FILE, WORK_SUBDIR
from gpuprov.store.work import Assignment, RunCommand, WorkRecords
from tests.gpuprov.test_agent_run import until
from tests.gpuprov.test_agent_work import JOB, assign, ended, node, work_dir
from tests.helpers import kill_recorded_pids

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

NEXT_JOB = "job2"
SECRET = "wandb-Zq8vJ3nX0aB4cD5e"  # the next job's WANDB_API_KEY


def alive(pid: int) -> bool:
    """The process is there and not a zombie waiting for its reaper."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z"


@pytest.fixture
def pid_files(tmp_path: Path) -> Iterator[Path]:
    """A folder for the pids the work's background processes write: whatever is still alive
    when the test ends is killed (the old agent left them running)."""
    folder = tmp_path / "pids"
    folder.mkdir()
    yield folder
    kill_recorded_pids(folder)


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def cgroup2_mount() -> str | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return fields[1]
    return None


def without_cgroups(tmp_path: Path) -> str:
    """An interpreter wrapper that runs the agent in a mount namespace of its own where the
    cgroup v2 filesystem is read-only (as in a container): the agent cannot make a cgroup."""
    mount = cgroup2_mount()
    assert mount is not None, "this machine has no cgroup v2 mounted"
    wrapper = tmp_path / "python-without-cgroups"
    remount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    wrapper.write_text(
        f"#!/bin/sh\nexec unshare -m sh -c '{remount}' - {mount} {sys.executable} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def daemon_script(pids: Path, name: str, loop: str) -> str:
    """Shell that leaves `loop` running in a session of its own, and ends once it runs and
    the file `<name>.go` is there."""
    pid_file = pids / name
    inner = f"echo $$ > {pid_file}; while :; do {loop}; sleep 0.05; done"
    return (
        f"setsid sh -c '{inner}' </dev/null >/dev/null 2>&1 &\n"
        f"while [ ! -s {pid_file} ] || [ ! -e {pid_file}.go ]; do sleep 0.05; done; echo started"
    )


def daemonise(pid_file: Path) -> str:
    """Python that daemonises (fork, setsid, fork), writes its pid and sleeps on."""
    return (
        "import os, time\n"
        "os.fork() and os._exit(0)\n"
        "os.setsid()\n"
        "os.fork() and os._exit(0)\n"
        f"open('{pid_file}', 'w').write(str(os.getpid()))\n"
        "time.sleep(300)\n"
    )


def double_fork(pids: Path, name: str) -> str:
    """Shell that leaves a double-forked grandchild behind and ends once it runs."""
    pid_file = pids / name
    wait = f"while [ ! -s {pid_file} ]; do sleep 0.05; done"
    return f'{sys.executable} -c "{daemonise(pid_file)}"\n{wait}'


@SQLITE
@pytest.mark.parametrize("cgroups", ["cgroup", "no-cgroup"])
async def test_a_setsid_daemon_is_gone_before_the_next_job_s_assignment_exists(
    records, tmp_path, pid_files, cgroups
):
    python = sys.executable if cgroups == "cgroup" else without_cgroups(tmp_path)
    leak = tmp_path / "leak"
    async with node(records, tmp_path, python) as (daemon, worker_id, _):
        work_root = daemon.state_dir / WORK_SUBDIR
        reader = f"cat {work_root}/*/{ASSIGNMENT_FILE} >> {leak} 2>/dev/null"
        work_id = assign(records, worker_id, daemon_script(pid_files, "reader", reader))
        await until(lambda: (pid_files / "reader").exists(), "the daemon started")
        pid = int((pid_files / "reader").read_text())
        cgroup = read(work_dir(daemon, work_id) / CGROUP_FILE)
        # The daemon left the work's session, but not its cgroup.
        in_cgroup = bool(cgroup) and str(pid) in read(Path(cgroup, "cgroup.procs")).split()
        assert alive(pid)
        await until(lambda: work_id in read(leak), "the daemon reading its own assignment")
        (pid_files / "reader.go").touch()
        row = await until(lambda: ended(records), "the first job's end")
        assert (row.state, row.exit_code) == (WorkState.EXITED, 0), daemon.log
        assert not alive(pid)  # killed before the end was reported
        assert in_cgroup if cgroups == "cgroup" else cgroup == ""
        assert not cgroup or not os.path.exists(cgroup)  # removed with it

        command = RunCommand(run="echo second", env={"WANDB_API_KEY": SECRET})
        # The worker serves the next job now, as that job's reservation makes it: a worker is
        # only handed work of the job run it serves.
        records.set_worker_state(worker_id, "busy", NEXT_JOB)
        work = WorkRecords(records.db)
        work.assign(NEXT_JOB, 0, [Assignment(rank=0, worker_id=worker_id, command=command)])
        second = work.for_worker(worker_id)
        assert second is not None
        await until(lambda: work.of_job(NEXT_JOB, 0)[0].state.final, "the second job's end")
        await until(lambda: not work_dir(daemon, second.id).exists(), "its directory removed")
    assert SECRET not in leak.read_text()


@SQLITE
async def test_a_double_forked_child_is_killed_at_the_work_s_end(records, tmp_path, pid_files):
    async with node(records, tmp_path) as (daemon, worker_id, _):
        assign(records, worker_id, double_fork(pid_files, "grandchild"))
        row = await until(lambda: ended(records), "the work's end")
        pid = int((pid_files / "grandchild").read_text())
        assert (row.state, row.exit_code) == (WorkState.EXITED, 0), daemon.log
        assert not alive(pid)


@SQLITE
async def test_a_stop_kills_what_the_work_left_in_a_session_of_its_own(
    records, tmp_path, pid_files
):
    script = daemon_script(pid_files, "daemon", ":") + "\nwhile :; do sleep 0.1; done"
    async with node(records, tmp_path) as (daemon, worker_id, _):
        assign(records, worker_id, script)
        await until(lambda: (pid_files / "daemon").exists(), "the daemon started")
        pid = int((pid_files / "daemon").read_text())
        (pid_files / "daemon.go").touch()
        WorkRecords(records.db).request_stop(JOB, 0)
        row = await until(lambda: ended(records), "the stop reported")
        assert row.state is WorkState.STOPPED
        assert not alive(pid)


@SQLITE
async def test_a_background_sleep_does_not_keep_the_work_running(records, tmp_path, pid_files):
    script = f"sleep 120 & echo $! > {pid_files / 'sleep'}; echo started"
    async with node(records, tmp_path) as (daemon, worker_id, _):
        assign(records, worker_id, script)
        started = time.monotonic()
        # well before the background sleep's 120 s, with room for a loaded machine
        row = await until(lambda: ended(records), "the work's end", timeout=90)
        assert time.monotonic() - started < 90
        assert (row.state, row.exit_code) == (WorkState.EXITED, 0)
        assert not alive(int((pid_files / "sleep").read_text()))


@SQLITE
async def test_the_work_dir_and_every_file_in_it_are_the_work_s_alone_then_removed(
    records, tmp_path
):
    async with node(records, tmp_path) as (daemon, worker_id, _):
        work_id = assign(records, worker_id, "echo ready; sleep 1; echo done", setup="echo setup")
        kept = work_dir(daemon, work_id)
        await until(lambda: (kept / PID_FILE).exists(), "the work running")
        assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(kept.stat().st_mode) == 0o700
        files = {path.name: stat.S_IMODE(path.stat().st_mode) for path in kept.iterdir()}
        assert files == dict.fromkeys(files, 0o600)
        assert {ASSIGNMENT_FILE, PID_FILE, CGROUP_FILE} <= set(files)
        owner = os.getuid()  # the agent runs the work as its own user
        assert {path.stat().st_uid for path in [kept, *kept.iterdir()]} == {owner}
        await until(lambda: ended(records), "the work's end")
        await until(lambda: not kept.exists(), "its directory removed")


def test_sweep_without_a_cgroup_kills_each_process_with_the_mark_and_no_other(tmp_path):
    started = []
    try:
        for mark in ("work-a", "work-b"):
            env = {"PATH": os.environ["PATH"], WORK_MARK: mark}
            code = daemonise(tmp_path / mark)
            subprocess.run(
                [sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, check=True
            )
            deadline = time.monotonic() + 10
            while not (tmp_path / mark).exists() or not (tmp_path / mark).read_text():
                assert time.monotonic() < deadline, "the daemon did not start"
                time.sleep(0.05)
            started.append(int((tmp_path / mark).read_text()))
        sweep("work-a")
        assert not alive(started[0])
        assert alive(started[1])  # another work's mark
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
