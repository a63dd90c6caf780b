"""The node agent on a machine that boots with cloud-init: the files it needs, where they go, and
the systemd unit that fetches agent.pyz from the API, checks it against its pinned SHA-256 and
runs it.

The agent is one zipapp, agent.pyz (providers/agent_artifact.py builds it, byte for byte the
same on every path), served by the API at GET /v1/node/agent.pyz. The create call's user data
(providers/userdata.py) carries no agent, only what fetches and pins it, through cloud-init's
write_files:

    /usr/local/lib/gpuprov/fetch.py            0644  gpuprov/node/fetch.py: fetch and verify
    /etc/gpuprov/join.env                      0600  GPUPROV_API_URL, GPUPROV_JOIN_TOKEN, GPUPROV_VM
    /etc/gpuprov/api-ca.pem                    0644  the API's CA, with `[api] ca_file`
    /etc/systemd/system/gpuprov-agent.service  0644  the unit below, the pin written into it

and runcmd enables and starts the unit, so the agent runs from the first boot on and again
after every reboot:

    ExecStartPre  fetch.py: /usr/local/lib/gpuprov/agent.pyz kept if its SHA-256 is the pin,
                  else GET <api>/v1/node/agent.pyz and written only if the bytes match it; an
                  API that does not answer, or a truncated or tampered archive, fails the start
                  (the agent never runs, the join token stays unspent)
    ExecStart     /usr/bin/python3 -I -S <agent.pyz> run --url <api> --token-file <join.env>
                  --state-dir /var/lib/gpuprov [--notices ec2|gce] [--ca-file <ca>]
                  (`--notices`: EC2 and GCE publish notices about the machine in its metadata)
    Restart       on failure, every 15 s (an API that is down, a network not up yet, an archive
                  refused), but not after the agent's exit 2 (refused for good: a used or
                  expired token)
    KillMode      process: the job's work, which the agent starts, outlives a restart of the
                  agent, which then follows it again
    Delegate      yes: the agent runs each work in a cgroup of its own below the unit's

`-I -S`: the system interpreter, isolated from PYTHON* variables, the user's site directory
and site-packages; the agent needs nothing but the standard library. The join token is read
from the root-only file, never from the command line or the unit's environment.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from providers import agent_artifact

AGENT_DIR = "/usr/local/lib/gpuprov"
AGENT_PATH = f"{AGENT_DIR}/agent.pyz"
FETCH_PATH = f"{AGENT_DIR}/fetch.py"
AGENT_ROUTE = "/v1/node/agent.pyz"  # gpuprov/api/node.py serves it
JOIN_ENV_PATH = "/etc/gpuprov/join.env"
CA_PATH = "/etc/gpuprov/api-ca.pem"
STATE_DIR = "/var/lib/gpuprov"
UNIT_NAME = "gpuprov-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
PYTHON = "/usr/bin/python3"
RESTART_SECONDS = 15
EXIT_REFUSED = 2  # gpuprov/node/cli.py: an error that retrying cannot fix


@dataclass(frozen=True)
class NoticeSource:
    """Where a cloud's machines read its notices about them (a reclaim, a maintenance): the
    agent's `--notices` ("ec2", "gce"; "none": the cloud publishes none) and, for the fake
    cloud's tests only, `--metadata-url` (a metadata server on loopback)."""

    cloud: str = "none"
    metadata_url: str | None = None

    def argv(self) -> list[str]:
        if self.cloud == "none":
            return []
        url = ["--metadata-url", self.metadata_url] if self.metadata_url else []
        return ["--notices", self.cloud, *url]


NO_NOTICES = NoticeSource()
EC2_NOTICES = NoticeSource("ec2")
GCE_NOTICES = NoticeSource("gce")


def agent_argv(api_url: str, ca: bool, notices: NoticeSource = NO_NOTICES) -> list[str]:
    """How the unit runs the agent (`run`: register once, then heartbeat)."""
    argv = [PYTHON, "-I", "-S", AGENT_PATH, "run", "--url", api_url]
    argv += ["--token-file", JOIN_ENV_PATH, "--state-dir", STATE_DIR, *notices.argv()]
    return argv + (["--ca-file", CA_PATH] if ca else [])


def fetch_argv(api_url: str, sha256: str, ca: bool) -> list[str]:
    """The step before every start: agent.pyz as pinned, fetched from the API if need be."""
    argv = [PYTHON, "-I", "-S", FETCH_PATH, agent_url(api_url), sha256, AGENT_PATH]
    return argv + ([CA_PATH] if ca else [])


def agent_url(api_url: str) -> str:
    return api_url.rstrip("/") + AGENT_ROUTE


def unit(api_url: str, ca: bool, notices: NoticeSource = NO_NOTICES) -> str:
    """The systemd unit that keeps the agent running. `api_url` must hold no control
    character (providers/userdata.py refuses one)."""
    return "\n".join(
        [
            "[Unit]",
            "Description=gpuprov node agent: registers this machine, then heartbeats",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Service]",
            "Type=simple",
            f"ExecStartPre={command_line(fetch_argv(api_url, agent_artifact.sha256(), ca))}",
            f"ExecStart={command_line(agent_argv(api_url, ca, notices))}",
            "Restart=on-failure",
            f"RestartSec={RESTART_SECONDS}",
            # The agent's exit 2: refused for good (a used or expired token, a CA that does not
            # verify the API): starting it again cannot help. Exit 1 (API unreachable, an
            # archive that does not match its pin) retries.
            f"RestartPreventExitStatus={EXIT_REFUSED}",
            # The job's work runs in a process group of its own under the agent: a restarted
            # agent follows it again, so stopping the agent must not end it.
            "KillMode=process",
            # The agent runs each work in a cgroup of its own under the unit's, and kills all
            # of it at the work's end: systemd leaves the subtree to it.
            "Delegate=yes",
            "UMask=0077",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def command_line(argv: list[str]) -> str:
    """argv as one systemd command line: each word quoted, `%` and `$` doubled so systemd
    neither expands a specifier nor a variable in it (systemd.service, "Command lines")."""
    return " ".join(_systemd_word(word) for word in argv)


def _systemd_word(word: str) -> str:
    escaped = word.replace("%", "%%").replace("$", "$$")
    if escaped and all(ch.isalnum() or ch in "/-._:=+" for ch in escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_command(unit_text: str, key: str) -> list[str]:
    """The command line `key` (ExecStart, ExecStartPre) of a unit `unit` wrote, split as
    systemd splits it: quoted words, `%%` and `$$` back to `%` and `$`."""
    [line] = [line for line in unit_text.splitlines() if line.startswith(f"{key}=")]
    words = shlex.split(line.removeprefix(f"{key}="))
    return [word.replace("%%", "%").replace("$$", "$") for word in words]
