"""What the ssh provider does on a machine: look at its host key, and log in to clean up.

Host-key trust per host, never skipped: the configured `host_key`, else the configured
`host_key_fingerprint`, else the key pinned the first time the address answered (kept in the
claims database). Reachability is an SSH handshake (key exchange, which proves the server
holds the host key) with no login; cleanup logs in with the host's own `key_path` and accepts
only that verified key. No ~/.ssh/config, known_hosts or ssh-agent of the worker is used.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass

import asyncssh

from providers.ssh.config import SshHost
from providers.ssh_common import (
    AGENT_FILE,
    REMOTE_ROOT,
    fingerprint,
    host_key_algorithms,
    isolated_options,
    remote_dir,
)

CLEANUP_TIMEOUT = 30.0


@dataclass
class HostKeyCheck:
    """The key a host presented, and whether we trust it (why not, if not)."""

    key: asyncssh.SSHKey
    problem: str | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key)


def address(host: SshHost) -> str:
    return f"{host.host}:{host.port}"


async def presented_host_key(
    host: SshHost, timeout: float, expected: asyncssh.SSHKey | None = None
) -> asyncssh.SSHKey:
    """The host key the server proves it holds in a key exchange (no login). With `expected`,
    the server is asked for that key's type. Raises OSError / TimeoutError / asyncssh.Error."""
    async with asyncio.timeout(timeout):
        key = await asyncssh.get_server_host_key(
            host.host, host.port, config=None, server_host_key_algs=host_key_algorithms(expected)
        )
    if key is None:  # a key exchange without a host key (GSS): nothing to verify
        raise asyncssh.ProtocolError("the server presented no host key")
    return key


def judge(host: SshHost, presented: asyncssh.SSHKey, pinned: str | None) -> str | None:
    """Why `presented` is not trusted for `host`, or None. `pinned`: the recorded key line."""
    got = fingerprint(presented)
    if host.host_key is not None:
        expected = asyncssh.import_public_key(host.host_key)
        if expected.public_data != presented.public_data:
            return f"host key {got} is not the configured {fingerprint(expected)}"
        return None
    if host.host_key_fingerprint is not None:
        if got != host.host_key_fingerprint:
            return f"host key {got} is not the configured {host.host_key_fingerprint}"
        return None
    if pinned is not None:
        recorded = asyncssh.import_public_key(pinned)
        if recorded.public_data != presented.public_data:
            return (
                f"host key changed: {got}, pinned {fingerprint(recorded)} "
                "(if the machine was re-installed on purpose, unpin it)"
            )
    return None


def expected_key(host: SshHost, pinned: str | None) -> asyncssh.SSHKey | None:
    """The full key to ask for, where one is known."""
    line = host.host_key or pinned
    return asyncssh.import_public_key(line) if line is not None else None


async def run_trusted(
    host: SshHost,
    trusted: asyncssh.SSHKey,
    client_key: asyncssh.SSHKey,
    command: str,
    timeout: float,
) -> asyncssh.SSHCompletedProcess:
    """Log in accepting only `trusted` as the host key and run one command."""
    async with asyncio.timeout(timeout):
        async with asyncssh.connect(
            host.host,
            host.port,
            username=host.user,
            client_keys=[client_key],
            known_hosts=([trusted], [], []),
            server_host_key_algs=host_key_algorithms(trusted),
            **isolated_options(),
        ) as connection:
            return await connection.run(command)


def cleanup_command(vm: str) -> str:
    """Stop the VM's agent if it still runs and remove its directory (where activities/
    bootstrap.py installed it); nothing else."""
    # `[.]` instead of `\.`: the pattern then cannot match this very command line.
    path = "/".join(part.replace(".", "[.]") for part in (REMOTE_ROOT, vm, AGENT_FILE))
    return (
        f"if command -v pkill >/dev/null 2>&1; then pkill -f -- {shlex.quote(path)}; fi; "
        f'rm -rf -- {remote_dir(vm)} && {{ rmdir "$HOME"/{REMOTE_ROOT} 2>/dev/null; true; }}'
    )
