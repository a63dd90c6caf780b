"""`gpuprov join` leaves the agent running: a systemd unit where it can (written and enabled
through a stand-in `systemctl` here, never this machine's), else the foreground command it
prints, which, run as printed, heartbeats with the credential join kept."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
from pathlib import Path

import pytest

from gpuprov.cli import join_service as service
from providers import agent_artifact
from tests.gpuprov.test_agent import install_agent
from tests.gpuprov.test_join import ControlPlane, control_plane, join_with_new_token, workers

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

__all__ = ["control_plane"]  # the fixture, used by name


def test_the_unit_runs_the_agent_from_its_kept_credential_and_stays_down_once_revoked(tmp_path):
    command = service.agent_command(Path("/usr/local/lib/gpuprov/agent.pyz"), "/root/w", "/ca.pem")
    unit = service.unit_text(command)

    assert f"ExecStart={shlex.join(command)}\n" in unit
    assert command[1:] == [
        "-I", "-S", "/usr/local/lib/gpuprov/agent.pyz", "run", "--state-dir", "/root/w",
        "--ca-file", "/ca.pem",
    ]  # fmt: skip
    assert "Restart=on-failure" in unit and "RestartPreventExitStatus=2" in unit
    assert "KillMode=process" in unit and "Delegate=yes" in unit  # the work's cgroup below it
    assert "WantedBy=multi-user.target" in unit and "--token" not in unit


def test_install_writes_the_agent_and_the_unit_then_enables_it(tmp_path):
    said = tmp_path / "systemctl-saw"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$*" >> {said}\n')
    systemctl.chmod(0o755)

    fetched = install_agent(tmp_path / "state")  # what fetch_agent left there, pinned
    running = service.install_systemd(
        str(tmp_path / "state"),
        None,
        fetched,
        unit_dir=tmp_path / "units",
        agent_dir=tmp_path / "lib",
        systemctl=str(systemctl),
    )

    assert running.unit == tmp_path / "units" / service.UNIT_NAME
    assert (tmp_path / "lib" / "agent.pyz").read_bytes() == agent_artifact.artifact()
    assert str(tmp_path / "lib" / "agent.pyz") in running.unit.read_text()
    assert said.read_text().splitlines() == ["daemon-reload", f"enable --now {service.UNIT_NAME}"]
    assert "systemd service gpuprov-agent.service" in running.lines()[0]


def test_a_failing_systemctl_says_how_to_run_the_agent_instead(tmp_path):
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2; exit 1\n")
    systemctl.chmod(0o755)
    with pytest.raises(service.ServiceError, match="Failed to connect to bus; start the agent"):
        service.install_systemd(
            "/state",
            None,
            install_agent(tmp_path / "state"),
            unit_dir=tmp_path,
            agent_dir=tmp_path,
            systemctl=str(systemctl),
        )


def test_an_agent_changed_after_it_was_fetched_is_not_installed(tmp_path):
    fetched = install_agent(tmp_path / "state")
    fetched.write_bytes(fetched.read_bytes() + b"\0")
    with pytest.raises(service.ServiceError, match="no longer matches its pinned SHA-256"):
        service.install_systemd(
            "/state", None, fetched, unit_dir=tmp_path, agent_dir=tmp_path / "lib"
        )
    assert not (tmp_path / "lib" / "agent.pyz").exists()


async def test_join_prints_a_foreground_command_that_heartbeats(
    control_plane: ControlPlane, tmp_path
):
    plane = control_plane
    token, code, out, err = await join_with_new_token(plane, "gpu-box-9", tmp_path)

    assert code == 0, err
    assert "no systemd service installed" in out
    command = shlex.split(out.rstrip().splitlines()[-1])
    assert command[1:5] == ["-I", "-S", command[3], "run"] and "--state-dir" in command
    assert token not in out + err
    [worker] = workers(plane.records)
    assert worker.heartbeats == 0

    process = await asyncio.create_subprocess_exec(
        *command, env=plane.env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while not (plane.records.get_worker(worker.id) or worker).heartbeats:
            assert asyncio.get_running_loop().time() < deadline, "no heartbeat"
            await asyncio.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()
    assert token not in stderr.decode()
