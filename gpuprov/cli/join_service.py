"""What `gpuprov join` leaves behind on a machine you own: the node agent running `run`, so the
worker heartbeats like every cloud machine's.

The agent is agent.pyz, the bytes every node runs: `fetch_agent` gets it from the API (GET
/v1/node/agent.pyz) into the state dir before the join token is spent, and keeps it only if
its SHA-256 is the pin, this gpuprov's own build of it (providers/agent_artifact.py). A
tampered or truncated archive, or an API of another gpuprov version, is refused and nothing
is registered.

- Where systemd runs and we are root: that agent.pyz copied to
  /usr/local/lib/gpuprov/agent.pyz (checked against the pin again), the unit
  /etc/systemd/system/gpuprov-agent.service, then `systemctl daemon-reload` and `systemctl enable
  --now gpuprov-agent.service`. The unit restarts the agent after a failure, but not after exit 0
  (its credential was revoked: `gpuprov workers remove`) or exit 2 (a refusal that a restart
  cannot fix).
- Elsewhere: the foreground command to run under whatever keeps processes alive there (tmux, a
  container's entrypoint, supervisord), printed by `gpuprov join`.

Either way the agent starts from the credential `join` kept in its state dir: no token is
involved any more, and the command line holds no secret.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpuprov.node import fetch
from gpuprov.node.http_client import masked_url
from providers import agent_artifact, node_agent

UNIT_NAME = "gpuprov-agent.service"
UNIT_DIR = Path("/etc/systemd/system")
AGENT_DIR = Path("/usr/local/lib/gpuprov")
AGENT_FILE = "agent.pyz"
SYSTEMD_RUNNING = Path("/run/systemd/system")  # sd_booted(3): systemd is the init system
ServiceMode = Literal["auto", "systemd", "none"]


class ServiceError(Exception):
    """The service could not be installed; the message says what to do instead."""


@dataclass
class LeftRunning:
    how: Literal["systemd", "foreground"]
    command: list[str]
    unit: Path | None = None

    def lines(self) -> list[str]:
        if self.how == "systemd":
            return [
                f"agent running as the systemd service {UNIT_NAME} ({self.unit}); "
                f"`journalctl -u {UNIT_NAME}` shows its log"
            ]
        return [
            "no systemd service installed (needs root and systemd); keep the agent running "
            "with this command, e.g. under tmux or your supervisor:",
            "    " + shlex.join(self.command),
        ]


def fetch_agent(api_url: str, ca_file: str | None, directory: str) -> Path:
    """agent.pyz from the API into `directory`, pinned to this gpuprov's build (a file there
    that already matches is kept); ServiceError when the API's does not match or cannot be
    had."""
    if "@" in api_url.partition("//")[2].partition("/")[0]:  # as the agent refuses it
        raise ServiceError(
            f"bad API URL {masked_url(api_url)!r}: credentials (user:password@) do not belong "
            "in it; the API takes none there"
        )
    agent = Path(directory) / AGENT_FILE
    url = node_agent.agent_url(api_url)
    problem = fetch.fetch(url, agent_artifact.sha256(), str(agent), ca_file)
    if problem is not None:
        raise ServiceError(problem.replace(url, masked_url(url)))
    return agent


def python() -> str:
    return shutil.which("python3") or sys.executable


def agent_command(agent: Path, state_dir: str, ca_file: str | None) -> list[str]:
    command = [python(), "-I", "-S", str(agent), "run", "--state-dir", state_dir]
    return command + (["--ca-file", ca_file] if ca_file else [])


def unit_text(command: list[str]) -> str:
    return (
        "[Unit]\n"
        "Description=gpuprov node agent (heartbeats to the control plane)\n"
        "Wants=network-online.target\n"
        "After=network-online.target\n"
        "\n"
        "[Service]\n"
        f"ExecStart={shlex.join(command)}\n"
        "Restart=on-failure\n"
        "RestartSec=10\n"
        "# 2: refused for good (a bad token, an unusable state dir). 0 (not restarted either):\n"
        "# the credential was revoked.\n"
        "RestartPreventExitStatus=2\n"
        "# A job's work outlives a restart of the agent, which then follows it again.\n"
        "KillMode=process\n"
        "# The agent runs each work in a cgroup of its own below the unit's, killed at its end.\n"
        "Delegate=yes\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def systemd_available() -> bool:
    return os.geteuid() == 0 and SYSTEMD_RUNNING.is_dir() and shutil.which("systemctl") is not None


def install_systemd(
    state_dir: str,
    ca_file: str | None,
    fetched: Path,
    *,
    unit_dir: Path = UNIT_DIR,
    agent_dir: Path = AGENT_DIR,
    systemctl: str = "systemctl",
) -> LeftRunning:
    """Copy the fetched agent (checked against the pin once more), write the unit, enable and
    start it."""
    agent_dir.mkdir(parents=True, exist_ok=True)
    agent = agent_dir / AGENT_FILE
    if fetch.sha256_of(str(fetched)) != agent_artifact.sha256():
        raise ServiceError(f"{fetched} no longer matches its pinned SHA-256: run join again")
    agent.write_bytes(fetched.read_bytes())
    agent.chmod(0o644)
    command = agent_command(agent, os.path.abspath(state_dir), ca_file)
    unit_dir.mkdir(parents=True, exist_ok=True)
    unit = unit_dir / UNIT_NAME
    unit.write_text(unit_text(command))
    unit.chmod(0o644)
    for args in (["daemon-reload"], ["enable", "--now", UNIT_NAME]):
        done = subprocess.run(
            [systemctl, *args], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-300:]
            raise ServiceError(
                f"systemctl {' '.join(args)} failed ({done.returncode}): {said}; start the agent "
                f"yourself: {shlex.join(command)}"
            )
    return LeftRunning("systemd", command, unit)


def leave_running(
    state_dir: str, ca_file: str | None, fetched: Path, mode: ServiceMode = "auto"
) -> LeftRunning:
    """The fetched agent as a service where `mode` and the machine allow, else its foreground
    command (the agent where `fetch_agent` left it)."""
    if mode == "systemd" or (mode == "auto" and systemd_available()):
        if not systemd_available():
            raise ServiceError("--service systemd needs root on a machine that runs systemd")
        return install_systemd(state_dir, ca_file, fetched)
    return LeftRunning("foreground", agent_command(fetched, os.path.abspath(state_dir), ca_file))
