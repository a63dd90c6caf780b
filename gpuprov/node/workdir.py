"""The files of a work's directory (<state dir>/work/<id>/, 0600 files in a 0700 directory):
their names, and the small readers and writers that never leave a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import os

WORK_SUBDIR = "work"  # <state dir>/work/<work id>/, removed once the end is reported
ASSIGNMENT_FILE = "assignment.json"  # written before the start is reported
SPAWNING_FILE = "spawning"  # written just before the supervisor starts: never started again
PID_FILE = "pid"  # the supervisor's, which is the work's process group
CGROUP_FILE = "cgroup"  # the work's own cgroup v2 directory ("" where none could be made)
EXIT_FILE = "exit.json"  # the supervisor's last word: {"code", "phase"}
CURSOR_FILE = "shipped.json"  # how far the output was sent, and the chunk being sent
LEASE_LAPSED_FILE = "lease-lapsed"  # the agent stopped the work: its lease lapsed
NOTICE_FILE = "notice.json"  # the cloud's notice that it takes the machine back, for the work
STREAMS = ("stdout", "stderr")  # and the files in the directory the work's output goes to


def write_json(path: str, value: object) -> None:
    """Written aside (0600), then renamed over: a reader sees the old file or the new one."""
    part = f"{path}.{os.getpid()}.part"
    descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(value, handle, indent=1)
    os.replace(part, path)


def put(path: str, text: str, new: int = 0) -> None:
    """`text` written to `path` (`new`: os.O_CREAT, a 0600 file) where that can be; a cgroup's
    file that is not there is never created in its place."""
    flags = os.O_WRONLY | new
    with contextlib.suppress(OSError), os.fdopen(os.open(path, flags, 0o600), "w") as handle:
        handle.write(text)


def read_file(path: str) -> str:
    try:
        with open(path, errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def read_json(path: str) -> dict | None:
    try:
        value = json.loads(read_file(path))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
