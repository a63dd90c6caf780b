"""`gpuprov demo-ssh` end to end: a real sshd, the node agent bootstrapped through it, then
nothing left (the sshd and the dev server included)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

GPUPROV = str(Path(sys.executable).parent / "gpuprov")


def processes_mentioning(text: str) -> list[str]:
    """Command lines of the running processes that contain `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def alive(pid: int) -> bool:
    """Running (a zombie, already ended, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1]
    except (OSError, IndexError):
        return False
    return not state.startswith("Z")


async def test_demo_ssh_bootstraps_the_agent_over_real_ssh_and_leaves_nothing_behind():
    process = await asyncio.create_subprocess_exec(
        GPUPROV,
        "demo-ssh",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), 120)
    out = stdout.decode()
    assert process.returncode == 0, out

    sshd = re.search(r"sshd \(OpenSSH, pid (\d+)\) on 127\.0\.0\.1:(\d+).* in (\S+)/sshd\n", out)
    assert sshd, out
    sshd_pid, port, data_dir = int(sshd.group(1)), sshd.group(2), sshd.group(3)
    fingerprint = re.search(r"host key (SHA256:\S+);", out)
    assert fingerprint, out

    # The history: the host ran and answered SSH, then bootstrap began; the agent it started
    # registered through the API while bootstrap waited for it; the job then read that
    # registration and was ready after that.
    steps = re.findall(r"\+\s*[\d.]+s  (\S+)", out)
    assert steps[:3] == ["plan", "launch", "wait_running"], out  # launch: prepare + create
    assert steps[3:] == ["bootstrap", "bootstrap", "await_registrations"], out

    # Bootstrap logged in to that sshd and verified the configured host key.
    booted = re.search(
        rf"bootstrap logged in to root@127\.0\.0\.1:{port}, verified host key "
        rf"{re.escape(fingerprint.group(1))} \(trust: fingerprint; matches the configured "
        r"fingerprint\), started the agent with the token on its stdin; worker (\w+)",
        out,
    )
    assert booted, out
    worker = booted.group(1)
    vm = r"demo-ssh-a1-n0-[0-9a-f]{6}"
    registered = re.search(rf"{vm} registered through the API as worker {worker}: (.*)", out)
    assert registered, out
    if shutil.which("nvidia-smi") is None:  # this machine: the agent's own verdict says so
        assert registered.group(1).startswith("no GPU; "), out
        assert "GPU runtime NOT OK: nvidia-smi not found" in registered.group(1)
    assert re.search(rf"agent installed on the node at {data_dir}/sshd/home/\.gpuprov/{vm}/", out)

    # `gpuprov health` for the node: reached over SSH, the agent answered.
    assert re.search(
        rf"\$ gpuprov health demo-ssh\n{vm}: healthy\n\s+info\s+ssh_ok: reachable over SSH; "
        r"the agent answers",
        out,
    ), out

    # Released: the host's claim let go, the agent's directory removed from the node.
    assert "[releasing]" in out and "job demo-ssh: completed" in out
    assert re.search(rf"{vm} \[ssh/owned\] this-machine: terminated ssh root@127.0.0.1:{port}", out)
    assert f"agent directory {data_dir}/sshd/home/.gpuprov on the node: removed" in out
    assert "nothing left running" in out and out.rstrip().endswith("all checks passed")

    # Nothing it started outlives it: sshd, its sessions, the agent, the dev server.
    assert not alive(sshd_pid), f"sshd {sshd_pid} still runs"
    assert processes_mentioning(data_dir) == []
    assert not Path(data_dir).exists()
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError("a process from the demo's session is still running")
