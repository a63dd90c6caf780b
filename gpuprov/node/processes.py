"""A work's processes: its cgroup v2 directory under the agent's own, the environment it starts
with (the agent's basics and its mark, GPUPROV_WORK_ID), and `sweep`, which kills every process
of a work by its cgroup and its mark, wherever it moved to.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import signal
import time

from .workdir import put, read_file

WORK_MARK = "GPUPROV_WORK_ID"  # in the work's environment: its processes found by it in /proc
WORK_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def new_cgroup(name: str) -> str:
    """A cgroup v2 directory `name` under the agent's own, for one work; "" where there is no
    cgroup v2 the agent may write (cgroup v1 alone, a cgroup not delegated to its user): the
    work's processes are then found by its mark alone."""
    own = re.findall(r"^0::(/\S*)", read_file("/proc/self/cgroup"), re.M)
    for mount in read_file("/proc/mounts").splitlines():
        if own and " cgroup2 " in mount:
            path = mount.split()[1] + own[0].rstrip("/") + "/" + name
            with contextlib.suppress(OSError):
                os.mkdir(path)
                return path
    return ""


def sweep(mark: str, cgroup: str = "") -> None:
    """Every process of one work killed, whatever session or group it moved to (`setsid`, a
    double fork): those in its cgroup (frozen, then cgroup.kill where the kernel has it) and
    those whose environment carries its mark, round after round until none is left (one forked
    meanwhile is caught next round); then its cgroup is removed. /proc/self never carries a
    work's mark: the agent's own environment has none."""
    tag = f"\0{WORK_MARK}={mark}\0"
    put(cgroup + "/cgroup.freeze", "1")  # frozen, nothing forks meanwhile
    put(cgroup + "/cgroup.kill", "1")  # from Linux 5.14; before it, each pid below
    for _ in range(99):
        pids = read_file(cgroup + "/cgroup.procs").split()
        pids += [
            pid for pid in os.listdir("/proc") if tag in "\0" + read_file(f"/proc/{pid}/environ")
        ]
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
        if not pids:
            break
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.rmdir(cgroup)


def work_env(extra: dict) -> dict:
    """The agent's own basics (never its credential or a token), and the assignment's env."""
    env = {key: value for key, value in os.environ.items() if key in WORK_ENV or key[:3] == "LC_"}
    env.setdefault("PATH", DEFAULT_PATH)
    if "HOME" not in env:
        with contextlib.suppress(KeyError):
            env["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
    env.update({str(key): str(value) for key, value in extra.items()})
    return env
