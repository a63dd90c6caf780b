"""`agent.pyz supervise DIR`, which the agent starts (never a person): the leader of one work's
process group, in its cgroup, running setup then run and writing the exit status last.
"""

from __future__ import annotations

import os
import signal
import subprocess

from .workdir import (
    ASSIGNMENT_FILE,
    CGROUP_FILE,
    EXIT_FILE,
    STREAMS,
    put,
    read_file,
    read_json,
    write_json,
)


def _phase(script: str, out: int, err: int, stops: list) -> int:
    """One phase, `/bin/sh -c script`, started with no stop recorded, and its exit status.

    The group's SIGTERM reaches the shell only once the shell is in the group and has exec'd.
    One that lands while it is being started, after the check that let the phase start and
    before the fork (the shell is not in the group yet), or between the fork and exec (the
    child still has this process's handler, and the signal ends with it), reaches this process
    alone: the shell would run on until SIGKILL. Such a stop is recorded by the time Popen
    returns, and passed on to the shell then."""
    shell = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=out,
                             stderr=err)  # fmt: skip
    if stops:
        # One that landed in the moment between exec and here reached the shell as well, which
        # gets a second copy then, having only just started; the others never got one.
        shell.send_signal(stops[0])
    return shell.wait()


def supervise(work_dir: str) -> int:
    """`agent.py supervise DIR`, which the agent starts (never a person): the leader of the
    work's process group. setup, then run, each `/bin/sh -c` (a non-login shell), their output
    appended to DIR/stdout and DIR/stderr, and the exit status written last, so an agent
    restarted meanwhile learns how the work ended. A stop (SIGTERM to the group) reaches the
    shells, and no phase starts after it. It first moves into the work's cgroup, so that all
    the work starts is in it."""
    put(read_file(os.path.join(work_dir, CGROUP_FILE)) + "/cgroup.procs", str(os.getpid()))
    stops: list = []
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: stops.append(number))
    command = (read_json(os.path.join(work_dir, ASSIGNMENT_FILE)) or {}).get("command") or {}
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    out, err = (os.open(os.path.join(work_dir, stream), flags, 0o600) for stream in STREAMS)
    code, phase = 0, "run"
    for phase in ("setup", "run"):
        if command.get(phase) and not stops:
            code = _phase(command[phase], out, err, stops)
        if stops and not code:
            code = -stops[0]
        if code:
            break
    write_json(os.path.join(work_dir, EXIT_FILE), {"code": code, "phase": phase})
    return 0
