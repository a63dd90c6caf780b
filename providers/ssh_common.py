"""What every SSH connection gpuprov makes has in common: the core's node bootstrap
(activities/ssh_connect.py, activities/bootstrap.py, activities/health.py) and the `ssh`
provider (providers/ssh/remote.py, providers/ssh/cloud.py) take these from here.

It lives under providers/ so both sides may import it (providers/ never imports activities/):

- `host_key_algorithms`: which host key type to ask the server for;
- `isolated_options`: the asyncssh options that keep the worker's own SSH setup out of every
  connection (no ~/.ssh/config, no ssh-agent, no password or keyboard-interactive prompts;
  public-key login only). known_hosts is not here: each caller says what it trusts;
- `describe_error`: a failed connection in a few words, for an error message;
- `fingerprint`, `public_line`: a key as OpenSSH prints it;
- where the node agent lives on a machine (`REMOTE_ROOT`, `AGENT_FILE`, `remote_dir`): bootstrap
  installs it there, and the ssh provider's cleanup removes exactly that.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

import asyncssh

# Unless a full host key is known, ask for host keys in OpenSSH's own order (asyncssh's default
# puts RSA first), so a fingerprint an operator or a cloud took of the ed25519 key is the one
# the server shows us.
PREFERRED_HOST_KEY_ALGS = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "rsa-sha2-256",
)
MAX_DESCRIPTION_CHARS = 300

# The node agent's home on a machine: "$HOME/.gpuprov/<vm>/agent.pyz" of the login user.
REMOTE_ROOT = ".gpuprov"
AGENT_FILE = "agent.pyz"


def host_key_algorithms(key: asyncssh.SSHKey | None) -> list[str]:
    """The host key algorithms to ask for: `key`'s type (the server may hold several), else
    OpenSSH's preference order."""
    if key is None:
        return list(PREFERRED_HOST_KEY_ALGS)
    return [alg.decode() for alg in key.sig_algorithms]


def isolated_options() -> dict[str, Any]:
    """asyncssh connect options: nothing from the worker's environment, public-key login only."""
    return {
        "config": None,
        "agent_path": None,
        "password": None,
        "kbdint_auth": False,
        "preferred_auth": "publickey",
    }


def describe_error(error: BaseException) -> str:
    """Why a connection failed, in a few words (OS and asyncssh errors name no secret)."""
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, asyncssh.DisconnectError):
        return f"disconnected: {error.reason}"
    if isinstance(error, OSError) and error.errno:
        return os.strerror(error.errno).lower()  # asyncio's own words name no reason
    return f"{type(error).__name__}: {error}"[:MAX_DESCRIPTION_CHARS]


def fingerprint(key: asyncssh.SSHKey) -> str:
    """OpenSSH's `SHA256:<base64>` fingerprint of a (public or private) key."""
    return key.get_fingerprint("sha256")


def public_line(key: asyncssh.SSHKey) -> str:
    """The key's public half as one OpenSSH line (`ssh-ed25519 AAAA... comment`)."""
    return key.export_public_key("openssh").decode().strip()


def remote_dir(vm: str) -> str:
    """The VM's agent directory on the machine, as a shell word (`$HOME` expands there)."""
    return f'"$HOME"/{REMOTE_ROOT}/{shlex.quote(vm)}'


def output_text(output: object) -> str:
    """A remote command's stdout or stderr as text (asyncssh gives str, bytes or None)."""
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output if isinstance(output, str) else ""


def output_tail(output: object, limit: int = 500) -> str:
    """The last three non-empty lines of a command's output, joined, at most `limit`
    characters: what an error message quotes. Empty when the command said nothing."""
    lines = [line.strip() for line in output_text(output).splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-limit:]
