"""What the suite leaves running: nothing. Every process a test starts (a node agent over SSH or
on a fake-cloud node, a worker, sshd, nginx, a Temporal dev server, PostgreSQL) is the suite's
to stop, and these checks fail the run when one outlives what started it.

A process is the suite's when one of these holds:
- its environment carries this run's mark (`GPUPROV_TEST_RUN`, set once by the conftest and
  inherited by every xdist worker and every child that keeps its parent's environment), and,
  inside a worker, that worker's id (`PYTEST_XDIST_WORKER`);
- its command line names, or its working directory lies under, this process's pytest temp
  root: children started with a scrubbed environment (the node agent's `env={"PATH": ...}`,
  sshd's sessions) still name the temp dir they were given. Each worker points `tempfile` (and
  `TMPDIR`) under its temp root, so directories made with `tempfile.mkdtemp` (the fake cloud's
  own node root) are marked too;
- it descends from this process.

Two checks use it:
- after each test's teardown, anything naming that test's own `tmp_path` must be gone (the
  test's teardown should have stopped it): the test errors, naming the process, which is then
  killed so that it cannot disturb the tests after it;
- at the end of the session (in each worker, and again in the xdist controller once the
  workers are gone), nothing of the suite's may be alive; the run fails otherwise.

A process is given a few seconds to finish exiting before it counts. Zombies are dead and do
not count.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

RUN_MARK = "GPUPROV_TEST_RUN"
WORKER = "PYTEST_XDIST_WORKER"
GRACE_SECONDS = 10.0


def mark_run() -> str:
    """This run's mark, set in the environment the first time (the xdist controller, or the
    only process): xdist workers and every child inherit it."""
    return os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)


def keep_temporary_files_under(root: Path) -> None:
    """`tempfile`'s directory (this process's and, through TMPDIR, its children's) moves under
    `root`, so what a test or the product makes with `mkdtemp` carries the path mark."""
    directory = root / "tmp"
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = str(directory)


@dataclass(frozen=True)
class Process:
    pid: int
    cmdline: str
    cwd: str

    def __str__(self) -> str:
        return f"pid {self.pid} (cwd {self.cwd}): {self.cmdline}"


def _read(pid: int) -> tuple[str, str, dict[str, str], int] | None:
    """cmdline, cwd, environment and parent of a live, non-zombie process; None if it is gone,
    a zombie, or not ours to read."""
    entry = Path("/proc") / str(pid)
    try:
        stat = (entry / "stat").read_text()
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state in ("Z", "X"):
            return None
        cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        cwd = os.readlink(entry / "cwd")
        raw = (entry / "environ").read_bytes()
    except (OSError, IndexError, ValueError):
        return None
    environ = {}
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        environ[key.decode(errors="replace")] = value.decode(errors="replace")
    return cmdline.strip(), cwd, environ, int(ppid)


def _ancestors() -> set[int]:
    """This process and every process above it (pytest, make, the shell): never leaks."""
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        info = _read(pid)
        if info is None:
            break
        pid = info[3]
    return found


def _pattern(roots: Iterable[str]) -> re.Pattern[str]:
    """A path in `roots` or under one: `.../test_a1` must not match `.../test_a10`."""
    return re.compile("|".join(re.escape(root) + r"(?=/|\s|$)" for root in roots))


def _scan(roots: list[str], worker: str | None, exclude: set[int]) -> list[Process]:
    """The suite's live processes (module docstring), but those in `exclude`."""
    run = os.environ.get(RUN_MARK)
    me = os.getpid()
    named = _pattern(roots)
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in exclude:
            info = _read(int(entry.name))
            if info is not None:
                table[int(entry.name)] = info

    def descends(pid: int) -> bool:
        seen = set()
        while pid in table and pid not in seen:
            seen.add(pid)
            pid = table[pid][3]
            if pid == me:
                return True
        return False

    found = []
    for pid, (cmdline, cwd, environ, _) in table.items():
        marked = run is not None and environ.get(RUN_MARK) == run
        if worker is not None:
            marked = marked and environ.get(WORKER) == worker
        if marked or named.search(cmdline) or named.search(cwd) or descends(pid):
            found.append(Process(pid, cmdline, cwd))
    return sorted(found, key=lambda process: process.pid)


def _scan_paths(roots: list[str], exclude: set[int]) -> list[Process]:
    """Live processes whose command line or working directory names one of `roots`."""
    found = []
    named = _pattern(roots)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not named.search(cmdline) and not named.search(os.readlink(entry / "cwd")):
                continue
        except OSError:
            continue
        info = _read(int(entry.name))
        if info is not None:
            found.append(Process(int(entry.name), info[0], info[1]))
    return found


def _after_grace(scan, grace: float) -> list[Process]:
    deadline = time.monotonic() + grace
    while True:
        left = scan()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def kill(processes: Iterable[Process]) -> None:
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)


def left_by_test(tmp_path: Path, grace: float = GRACE_SECONDS) -> list[Process]:
    """What still runs naming a test's own `tmp_path` (it should have stopped all of it)."""
    exclude = _ancestors()
    roots = [str(tmp_path)]
    return _after_grace(lambda: _scan_paths(roots, exclude), grace)


def left_by_session(
    roots: list[Path], worker: str | None, exclude: Iterable[int] = (), grace: float = GRACE_SECONDS
) -> list[Process]:
    """What the suite (this worker's part of it, when `worker` is set) still runs."""
    excluded = _ancestors() | set(exclude)
    names = [str(root) for root in roots]
    return _after_grace(lambda: _scan(names, worker, excluded), grace)


def report(what: str, processes: list[Process]) -> str:
    lines = "\n".join(f"  {process}" for process in processes)
    return f"{what} left {len(processes)} process(es) running (now killed):\n{lines}"
