"""The fake cloud's machines with the real node agent (`[providers.fake] agent = "real"`).

Each booted instance becomes a local process tree, started the way cloud-init and a systemd unit
would start the agent on a real machine:

- a private root per instance (`<agent root>/<instance id>/`), where the instance's user data
  (providers/userdata.py, exactly what a cloud with user data gets) is applied as cloud-init
  applies `write_files`: join.env lands at `<root>/etc/gpuprov/join.env`, mode 0600;
- the unit those files hold, run as systemd would run it, every node path moved under the
  root: its ExecStartPre (gpuprov/node/fetch.py) fetches agent.pyz from the API's GET
  /v1/node/agent.pyz into `<root>/usr/local/lib/gpuprov/agent.pyz` and keeps it only if its
  SHA-256 is the one pinned in the unit, again every RESTART_SECONDS until it is (a tampered
  or truncated archive never runs, and the join token stays unspent); then its ExecStart,
  `python -I -S agent.pyz run --url <api> --token-file <root>/etc/gpuprov/join.env
  --state-dir <root>/var/lib/gpuprov`, with `--disk-path <root> --libcuda none`, in its own
  process group, its output in `<root>/agent.log`; its environment holds no secret (PATH,
  LANG, and HOME: the root);
- a stub `nvidia-smi` first on its PATH that replays captured outputs (package data,
  providers/fake/nvidia_smi/) of an 8 x H100 node: healthy, or, per the instance's fault, a
  driver mismatch from boot (bad_runtime) or, from `fault_after` seconds after boot, a GPU
  fallen off the bus (gpu_lost, Xid 79), an uncorrectable ECC error (ecc_error, Xid 48) or a
  GPU gone from the list (gpu_missing).

The agent runs the job's work as it would on a machine (agent.pyz `supervise`, in a
process group of its own under the instance's state dir), so a node's work outlives its agent:
an agent restarted in the same root (a worker that took over the cloud, `agent_root` set) finds
it there and follows it. Deleting the instance is the machine gone: its agent's process group
and every work's, at once. On Linux the agent also dies with the process that started it
(PR_SET_PDEATHSIG), so a killed worker leaves no agent behind; the work goes on until the
instance is deleted, as on a machine whose agent was restarted.
"""

from __future__ import annotations

import contextlib
import email
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuprov.node import processes, workdir
from providers import node_agent
from providers.errors import ErrorKind, ProviderError
from providers.fake.config import FakeInstanceType

DEFAULT_FIXTURES = Path(__file__).resolve().parent / "nvidia_smi"  # package data
STATE_DIR = node_agent.STATE_DIR.lstrip("/")
AGENT_PATH = node_agent.AGENT_PATH.lstrip("/")
NODE_DIRS = (node_agent.AGENT_DIR, "/etc/gpuprov", node_agent.STATE_DIR)
RESTART_SECONDS = 1.0  # the unit's RestartSec, shortened: a fake node boots in seconds
GPU_QUERY = ("--query-gpu=name,memory.total,driver_version,uuid", "--format=csv,noheader,nounits")
UNKNOWN_OPTION = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


@dataclass(frozen=True)
class Replay:
    """What the stub prints: the GPU query and `-q` (file, exit status each)."""

    query: tuple[str, int]
    details: tuple[str, int]
    version: str = "version-550.txt"
    banner: str = "banner-h100-80gb-hbm3-x8.txt"


HEALTHY = Replay(("query-h100-80gb-hbm3-x8.txt", 0), ("q-h100-80gb-hbm3-x8.txt", 0))
BROKEN = {
    # nvidia-smi cannot initialise NVML at all: every command says so (exit 18).
    "bad_runtime": Replay(("driver-mismatch.txt", 18), ("driver-mismatch.txt", 18)),
    "gpu_lost": Replay(("query-gpu-lost.txt", 15), ("q-h100-80gb-hbm3-x8-xid79-lost.txt", 15)),
    "ecc_error": Replay(
        ("query-h100-80gb-hbm3-x8.txt", 0), ("q-h100-80gb-hbm3-x8-xid48-dbe.txt", 0)
    ),
    "gpu_missing": Replay(
        ("query-h100-80gb-hbm3-x7-missing.txt", 0), ("q-h100-80gb-hbm3-x7.txt", 0)
    ),
}
# The machines whose nvidia-smi output was captured: (GPU model, count).
CAPTURED = {("H100", 8)}


def check_captured(instance_type: FakeInstanceType, fixtures: Path = DEFAULT_FIXTURES) -> None:
    """Unavailable for an instance type whose nvidia-smi no capture stands in for, or where the
    captures are not (moved or removed: set nvidia_smi_fixtures)."""
    if (instance_type.gpu, instance_type.gpu_count) not in CAPTURED:
        raise ProviderError(
            ErrorKind.UNAVAILABLE,
            f"no captured nvidia-smi output for {instance_type.name} "
            f"({instance_type.gpu_count} x {instance_type.gpu}): the real-agent fake cloud "
            "replays an 8 x H100 node",
        )
    needed = {HEALTHY.query[0], HEALTHY.details[0], HEALTHY.version, HEALTHY.banner}
    for replay in BROKEN.values():
        needed |= {replay.query[0], replay.details[0]}
    missing = sorted(name for name in needed if not (fixtures / name).is_file())
    if missing:
        raise ProviderError(
            ErrorKind.UNAVAILABLE,
            f"the captured nvidia-smi outputs are not in {fixtures} ({', '.join(missing[:3])} "
            "...): set [providers.fake] nvidia_smi_fixtures",
        )


def stub_script(fixtures: Path, healthy: Replay, broken: Replay | None, broken_from: float) -> str:
    """A POSIX-sh nvidia-smi: `healthy` until the epoch second `broken_from`, then `broken`."""

    def replay(outputs: Replay) -> list[str]:
        first, second = GPU_QUERY
        (query, query_exit), (details, details_exit) = outputs.query, outputs.details
        return [
            f'  if [ "$1" = "{first}" ] && [ "$2" = "{second}" ] && [ "$#" -eq 2 ]; then',
            f"    cat {shlex.quote(str(fixtures / query))}; exit {query_exit}",
            '  elif [ "$1" = "-q" ] && [ "$#" -eq 1 ]; then',
            f"    cat {shlex.quote(str(fixtures / details))}; exit {details_exit}",
            '  elif [ "$1" = "--version" ]; then',
            f"    cat {shlex.quote(str(fixtures / outputs.version))}; exit 0",
            '  elif [ "$#" -eq 0 ]; then',
            f"    cat {shlex.quote(str(fixtures / outputs.banner))}; exit 0",
            "  fi",
            f'  echo "{UNKNOWN_OPTION}"; exit 2',
        ]

    lines = ["#!/bin/sh"]
    if broken is not None:
        lines += [f'if [ "$(date +%s)" -ge {int(broken_from)} ]; then', *replay(broken), "fi"]
    lines += replay(healthy)
    return "\n".join(lines) + "\n"


def cloud_init_files(user_data: str) -> list[dict[str, Any]]:
    """The `write_files` entries of every cloud-config part of the user data (a MIME
    multi-part archive, or one cloud-config document)."""
    parts: list[str] = []
    if user_data.startswith("#cloud-config"):
        parts = [user_data]
    else:
        message = email.message_from_string(user_data)
        for part in message.walk():
            if part.get_content_type() == "text/cloud-config":
                payload = part.get_payload(decode=True)
                parts.append(payload.decode() if isinstance(payload, bytes) else str(payload))
    files: list[dict[str, Any]] = []
    for part in parts:
        document = yaml.safe_load(part) or {}
        files += [entry for entry in document.get("write_files") or [] if entry.get("path")]
    return files


def apply_write_files(root: Path, user_data: str) -> None:
    """What cloud-init's write_files does, under `root`."""
    for entry in cloud_init_files(user_data):
        path = root / str(entry["path"]).lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = int(str(entry.get("permissions", "0644")), 8)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(str(entry.get("content", "")))
        os.chmod(path, mode)


# Run first in the child on Linux: ask for SIGKILL when the process that started it dies
# (prctl PR_SET_PDEATHSIG, kept across exec), then become the agent. A wrapper instead of
# Popen's preexec_fn, which is unsafe in a process with threads (the worker has many).
DIE_WITH_PARENT = (
    "import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 9); os.execv(sys.argv[1], sys.argv[1:])"
)


# What systemd does with the unit's two command lines: ExecStartPre again every RestartSec until
# it passes (Restart=on-failure), then ExecStart in its place, as the same process.
AS_THE_UNIT = """
import os, subprocess, sys, time
pause, words = float(sys.argv[1]), sys.argv[2:]
cut = words.index("--")
while subprocess.call(words[:cut], stdin=subprocess.DEVNULL):
    time.sleep(pause)
os.execv(words[cut + 1], words[cut + 1 :])
"""


def rooted(root: Path, argv: list[str]) -> list[str]:
    """A unit's command line on this fake machine: its node paths under `root`, and this
    interpreter for the system's python3 (the one the unit names need not exist here)."""
    moved = [sys.executable if argv[0] == node_agent.PYTHON else argv[0]]
    for word in argv[1:]:
        for directory in NODE_DIRS:
            word = word.replace(directory, f"{root}{directory}")
        moved.append(word)
    return moved


class Node:
    """One instance's agent: its root, its process group, its log."""

    def __init__(self, root: Path, process: subprocess.Popen[bytes]) -> None:
        self.root = root
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log(self) -> Path:
        return self.root / "agent.log"

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    def running(self) -> bool:
        return self.process.poll() is None

    def work_groups(self) -> list[int]:
        """The process groups of the work the agent started here (their leaders' pids)."""
        groups = []
        for pid_file in (self.state_dir / workdir.WORK_SUBDIR).glob(f"*/{workdir.PID_FILE}"):
            with contextlib.suppress(OSError, ValueError):
                groups.append(int(pid_file.read_text()))
        return groups

    def kill(self) -> None:
        """The machine is gone: every process of its agent's group and its work's, at once, and
        then whatever the work left in a session of its own (its cgroup, its mark)."""
        for group in [self.process.pid, *self.work_groups()]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        for work in (self.state_dir / workdir.WORK_SUBDIR).glob("*/"):
            cgroup = work / workdir.CGROUP_FILE
            processes.sweep(work.name, cgroup.read_text() if cgroup.exists() else "")


def boot(
    root: Path,
    user_data: str,
    *,
    fixtures: Path,
    fault: str,
    broken_from: float,
) -> Node:
    """Lay out the instance's root and start its agent."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    apply_write_files(root, user_data)
    unit = (root / node_agent.UNIT_PATH.lstrip("/")).read_text()
    fetch = rooted(root, node_agent.unit_command(unit, "ExecStartPre"))
    start = rooted(root, node_agent.unit_command(unit, "ExecStart"))
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "nvidia-smi"
    stub.write_text(stub_script(fixtures, HEALTHY, BROKEN.get(fault), broken_from))
    stub.chmod(0o755)
    wrapper = [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT]
    argv = [
        *(wrapper if sys.platform == "linux" else []),
        sys.executable, "-I", "-S", "-c", AS_THE_UNIT, str(RESTART_SECONDS),
        *fetch, "--", *start, "--disk-path", str(root), "--libcuda", "none",
    ]  # fmt: skip
    # Only what a service's environment holds: no secret of this process, no token. HOME is
    # the instance's root, where its work starts, as a machine's work starts in root's home.
    path = f"{bin_dir}{os.pathsep}/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": path, "LANG": "C.UTF-8", "HOME": str(root)}
    with open(root / "agent.log", "ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
            env=env,
            start_new_session=True,
        )
    return Node(root, process)
