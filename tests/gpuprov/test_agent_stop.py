"""A stop reports its signal, wherever it lands in the supervisor's and the agent's steps
(gpuprov/node/supervisor.py, gpuprov/node/work.py): a SIGTERM that reaches the supervisor while
a phase's shell is being started is passed on to that shell (it ends at once, -15, no SIGKILL);
two threads asking for a stop at once send one SIGTERM; once the work is seen to have ended,
its outcome is the final one (killed after the grace period says so)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuprov.node import work as work_module
from gpuprov.node.work import Work
from gpuprov.node.workdir import ASSIGNMENT_FILE, CGROUP_FILE, EXIT_FILE, write_json

ROOT = Path(__file__).resolve().parents[2]

# `supervise DIR` with a hook at the point a stop can fall between: the phase allowed to start
# (no stop recorded yet), its shell not yet started ("before": the group's SIGTERM reaches the
# supervisor alone), or started ("after": the shell's copy lost, as it is when it lands between
# fork and exec, where the child still has the supervisor's handler). The signal is sent to the
# supervisor only, as the agent's killpg reaches it then.
SUPERVISE_WITH_A_LATE_STOP = """
import os, signal, subprocess, sys
sys.path.insert(0, sys.argv[1])
from gpuprov.node.supervisor import supervise
when, started = sys.argv[3], subprocess.Popen

def late_stop(*args, **kwargs):
    if when == "before":
        os.kill(os.getpid(), signal.SIGTERM)
    shell = started(*args, **kwargs)
    if when == "after":
        os.kill(os.getpid(), signal.SIGTERM)
    return shell

subprocess.Popen = late_stop
sys.exit(supervise(sys.argv[2]))
"""


def work_dir(tmp_path: Path, run: str, grace: float = 30.0) -> tuple[Path, dict]:
    directory = tmp_path / "work"
    directory.mkdir(mode=0o700)
    assignment = {"id": f"stop-{os.getpid()}-{time.monotonic_ns()}", "command": {"run": run},
                  "stop_grace_seconds": grace}  # fmt: skip
    write_json(str(directory / ASSIGNMENT_FILE), assignment)
    (directory / CGROUP_FILE).write_text("")  # none: the supervisor stays where it is
    return directory, assignment


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_stop_while_the_shell_is_being_started_reaches_the_shell(tmp_path, when):
    directory, _ = work_dir(tmp_path, "sleep 30")
    argv = [sys.executable, "-I", "-S", "-c", SUPERVISE_WITH_A_LATE_STOP, str(ROOT),
            str(directory), when]  # fmt: skip
    supervisor = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        supervisor.wait(timeout=10)  # the shell would sleep out its 30 s, or its SIGKILL
    except subprocess.TimeoutExpired:
        pytest.fail(f"a stop {when} the shell started never reached it: still running")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait()
    ended = json.loads((directory / EXIT_FILE).read_text())
    assert ended == {"code": -signal.SIGTERM, "phase": "run"}


def spawned(tmp_path: Path, run: str, grace: float = 30.0) -> Work:
    directory, assignment = work_dir(tmp_path, run, grace)
    work = Work(str(directory), assignment)
    work.spawn()
    return work


def until_ready(work: Work) -> None:
    """The run's shell has said `ready`: the supervisor's handlers are set, and the shell's."""
    stdout, deadline = Path(work.file("stdout")), time.monotonic() + 10
    while not (stdout.exists() and "ready" in stdout.read_text()):
        assert time.monotonic() < deadline, "the work did not start"
        time.sleep(0.02)


def until_ended(work: Work, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while work.running():
        assert time.monotonic() < deadline, "the work did not end"
        time.sleep(0.02)


def test_two_threads_asking_for_a_stop_at_once_send_one_sigterm(tmp_path, monkeypatch):
    work = spawned(tmp_path, "echo ready; sleep 30")
    sent: list[int] = []
    signal_group, running = Work.signal, Work.running

    def slow_running(self: Work) -> bool:  # widens the window between the check and the send
        answer = running(self)
        time.sleep(0.1)
        return answer

    def recorded(self: Work, signum: int) -> None:
        sent.append(signum)
        signal_group(self, signum)

    monkeypatch.setattr(Work, "running", slow_running)
    monkeypatch.setattr(Work, "signal", recorded)
    try:
        until_ready(work)
        heartbeat = threading.Thread(target=work.stop)
        heartbeat.start()
        work.stop()
        heartbeat.join()
        until_ended(work)
    finally:
        work.end()
    assert sent.count(signal.SIGTERM) == 1


def test_a_work_killed_after_its_grace_says_so_as_soon_as_it_is_seen_ended(tmp_path, monkeypatch):
    work = spawned(tmp_path, "trap '' TERM; echo ready; sleep 30", grace=0.3)  # deaf to SIGTERM
    sweep = work_module.sweep

    def slow_sweep(mark: str, cgroup: str = "") -> None:  # the kill's sweep takes its time
        sweep(mark, cgroup)
        time.sleep(0.5)

    monkeypatch.setattr(work_module, "sweep", slow_sweep)
    try:
        until_ready(work)
        work.stop()
        until_ended(work)
        code, note = work.outcome()  # the runner reads it as soon as the work is seen ended
    finally:
        work.end()
    assert (code, note) == (-signal.SIGKILL, "gpuprov-agent: killed after the 0.3s grace period")
