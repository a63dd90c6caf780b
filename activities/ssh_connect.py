"""Open an SSH connection whose host key is verified, waiting (bounded) until sshd answers.

Host-key verification is never switched off. `HostKeyTrust` says what the host must present:
every expected public key and every expected fingerprint given must match the key the server
proves it holds; with none given, the connection is trust-on-first-use and the caller pins the
key it returns (activities/ssh_keys.py). asyncssh asks `validate_host_public_key` about each key
the server offers and then checks the server's signature with it, so a match means the server
holds the private key.

Nothing from the user's environment is read: no ~/.ssh/config, no ~/.ssh/known_hosts, no
ssh-agent, no password prompts. Only the client key handed in is offered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncssh

from activities.ssh_keys import normalize_fingerprint
from providers.errors import ErrorKind, ProviderError
from providers.ssh_common import (
    describe_error,
    fingerprint,
    host_key_algorithms,
    isolated_options,
)

CONNECT_TIMEOUT = 10.0  # seconds per connection attempt (TCP + handshake + login)
KEEPALIVE = 15.0


@dataclass
class HostKeyTrust:
    """What the server's host key must be. Empty = first use (any key, to be pinned)."""

    keys: list[asyncssh.SSHKey] = field(default_factory=list)
    fingerprints: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.fingerprints = [normalize_fingerprint(value) for value in self.fingerprints]

    def accepts(self, key: asyncssh.SSHKey) -> bool:
        return all(key.public_data == known.public_data for known in self.keys) and all(
            fingerprint(key) == expected for expected in self.fingerprints
        )

    def describe(self) -> str:
        known = [fingerprint(key) for key in self.keys] + self.fingerprints
        return " and ".join(sorted(set(known))) or "any key (first use)"

    def host_key_algorithms(self) -> list[str]:
        """Make the server present the expected key's type (it may hold several); with no full
        key known, OpenSSH's order, so a fingerprint of the ed25519 key is the one we see."""
        return host_key_algorithms(self.keys[0] if self.keys else None)


class HostKeyMismatch(Exception):
    """The server presented a host key we do not trust."""

    def __init__(self, presented: str, expected: str) -> None:
        super().__init__(f"host key {presented} is not the expected {expected}")
        self.presented = presented


class _VerifyingClient(asyncssh.SSHClient):
    def __init__(self, trust: HostKeyTrust) -> None:
        self._trust = trust
        self.presented: asyncssh.SSHKey | None = None
        self.refused: str | None = None

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        if self._trust.accepts(key):
            self.presented = key
            return True
        self.refused = fingerprint(key)
        return False


@dataclass
class Endpoint:
    host: str
    port: int
    user: str


async def connect_verified(
    endpoint: Endpoint,
    client_key: asyncssh.SSHKey,
    trust: HostKeyTrust,
    timeout: float = CONNECT_TIMEOUT,
) -> tuple[asyncssh.SSHClientConnection, asyncssh.SSHKey]:
    """One attempt: the connection and the host key the server proved it holds.

    Raises HostKeyMismatch for an untrusted key; asyncssh / OS errors otherwise."""
    client = _VerifyingClient(trust)
    try:
        async with asyncio.timeout(timeout):
            connection, _ = await asyncssh.create_connection(
                lambda: client,
                endpoint.host,
                endpoint.port,
                username=endpoint.user,
                client_keys=[client_key],
                # Non-empty-tuple form: trust nothing up front, so every key goes through
                # validate_host_public_key (an empty value would read ~/.ssh/known_hosts).
                known_hosts=([], [], []),
                keepalive_interval=KEEPALIVE,
                server_host_key_algs=trust.host_key_algorithms(),
                **isolated_options(),
            )
    except asyncssh.HostKeyNotVerifiable:
        if client.refused is not None:
            raise HostKeyMismatch(client.refused, trust.describe()) from None
        raise
    assert client.presented is not None
    return connection, client.presented


async def wait_for_sshd(
    endpoint: Endpoint,
    client_key: asyncssh.SSHKey,
    trust: HostKeyTrust,
    deadline: float,
    interval: float,
    on_attempt: Callable[[str], None] | None = None,
) -> tuple[asyncssh.SSHClientConnection, asyncssh.SSHKey]:
    """Try to connect until `deadline` (time.time()), pausing `interval` between attempts.

    Not listening yet, refused, reset, timed out, or our key not yet authorized (cloud-init
    writes authorized_keys around when sshd starts): try again. A host key we do not trust:
    Failed at once (never retried: the token must not go to an impostor). Past the deadline:
    Failed, naming the last problem seen."""
    where = f"{endpoint.user}@{endpoint.host}:{endpoint.port}"
    problem = "no attempt made"
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            raise ProviderError(
                ErrorKind.FAILED, f"sshd at {where} not usable before the boot timeout: {problem}"
            )
        try:
            return await connect_verified(
                endpoint, client_key, trust, timeout=min(CONNECT_TIMEOUT, remaining)
            )
        except HostKeyMismatch as mismatch:
            raise ProviderError(
                ErrorKind.FAILED, f"refusing {where}: {mismatch}; not sending it anything"
            ) from None
        except asyncssh.PermissionDenied:
            problem = f"permission denied for {endpoint.user} with the control plane's key"
        except (OSError, TimeoutError, asyncssh.Error) as error:
            problem = describe_error(error)
        if on_attempt is not None:
            on_attempt(problem)
        await asyncio.sleep(max(0.0, min(interval, deadline - time.time())))
