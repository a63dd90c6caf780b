"""Real SSH servers on loopback for tests: OpenSSH's sshd, and an asyncssh server.

`start_sshd(directory)` is gpuprov/cli/local_sshd.py's (the launcher `gpuprov demo-ssh` uses too):
`/usr/sbin/sshd -D -f <its own config>` on a free 127.0.0.1 port with its own ed25519 host key,
authorized_keys and PidFile, all inside `directory` (`StrictModes no`, since they live under a
temp dir). Sessions get `HOME=<directory>/home` (sshd's `SetEnv`), so what a test installs "in
the home directory" stays in the temp dir. It needs root (privilege separation; `/run/sshd` is
created) and openssh-server installed (`make test` installs it); without them the tests fail
with a message, never skip.

`start_asyncssh_server(directory)` is the second implementation: an asyncssh server whose exec
requests run `/bin/sh -c <command>` locally with the same HOME convention.

Both hand back a `TestServer` with the host and client keys; stop them with `.stop()` (or use
the context managers).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
import pytest

from gpuprov.cli import local_sshd
from gpuprov.cli.local_sshd import LocalSshd, SshdUnavailable, free_port, generate_keys

__all__ = [
    "LocalSshd",
    "TestServer",
    "free_port",
    "running_asyncssh_server",
    "running_sshd",
    "start_asyncssh_server",
    "start_sshd",
]

# What sshd gives sessions (no pyenv shims): the node agent runs with the system python3.
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class TestServer(LocalSshd):
    """A running SSH server (sshd, or the asyncssh one with `_server`)."""

    __test__ = False  # not a test class, despite the name

    _server: asyncssh.SSHAcceptor | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def stop(self) -> None:
        super().stop()
        if self._server is not None:
            self._server.close()
        stop_left_behind(self.home)


def stop_left_behind(home: Path) -> list[int]:
    """SIGKILL what the server's sessions left running: a node agent started over SSH daemonises
    (as on a real node) and would keep retrying a dead API after its test. A process counts as
    the session's when its command line names the home directory or it runs inside it (the
    agent's work). Scans again until one finds nothing (a process may be forking as the last
    scan passes it). Returns the pids it killed."""
    killed: list[int] = []
    for scan in range(10):
        found = _kill_marked(str(home))
        killed += found
        if not found and scan > 0:
            return killed
        time.sleep(0.1)
    return killed


def _kill_marked(mark: str) -> list[int]:
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if mark in cmdline or cwd == mark or cwd.startswith(mark + "/"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


def start_sshd(
    directory: Path, authorized: list[asyncssh.SSHKey] | None = None, rsa_too: bool = False
) -> TestServer:
    """gpuprov.cli.local_sshd.start_sshd, failing the test (never skipping it) where sshd cannot
    run here."""
    try:
        server = local_sshd.start_sshd(directory, authorized, rsa_too)
    except SshdUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    values = {item.name: getattr(server, item.name) for item in dataclasses.fields(LocalSshd)}
    return TestServer(**values)


@contextlib.contextmanager
def running_sshd(
    directory: Path, authorized: list[asyncssh.SSHKey] | None = None, rsa_too: bool = False
) -> Iterator[TestServer]:
    server = start_sshd(directory, authorized, rsa_too)
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------- asyncssh


async def _run_locally(process: asyncssh.SSHServerProcess[bytes], home: Path, path: str) -> None:
    """An exec request: `/bin/sh -c <command>` here. Simple on purpose: the client's stdin is
    read to its end first (bootstrap always sends all of it, then EOF), then the command runs
    and its output and exit status go back."""
    received = await process.stdin.read()
    local = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        process.command or "true",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"HOME": str(home), "PATH": path},
        cwd=home,
    )
    stdout, stderr = await local.communicate(received)
    process.stdout.write(stdout)
    process.stderr.write(stderr)
    process.exit(local.returncode if local.returncode is not None else 255)


async def start_asyncssh_server(
    directory: Path,
    *,
    port: int | None = None,
    host_key: asyncssh.SSHKey | None = None,
    authorized: list[asyncssh.SSHKey] | None = None,
    path: str = SESSION_PATH,
) -> TestServer:
    """An asyncssh server on loopback with its own host key (or `host_key`) and authorized
    client keys (its own plus `authorized`); commands run with `PATH=path`."""
    generated_host_key, client_key, client_path = generate_keys(directory, authorized)
    host_key = host_key or generated_host_key
    home = directory / "home"
    authorized = asyncssh.import_authorized_keys((directory / "authorized_keys").read_text())
    acceptor = await asyncssh.listen(
        "127.0.0.1",
        port or 0,
        server_host_keys=[host_key],
        authorized_client_keys=authorized,
        process_factory=lambda process: _run_locally(process, home, path),
        encoding=None,
        allow_scp=False,
    )
    bound = acceptor.sockets[0].getsockname()[1]
    return TestServer(
        host="127.0.0.1",
        port=bound,
        user=os.environ.get("USER", "root"),
        directory=directory,
        home=home,
        host_key=host_key,
        client_key=client_key,
        client_key_path=client_path,
        _server=acceptor,
    )


@contextlib.asynccontextmanager
async def running_asyncssh_server(directory: Path, **options: object) -> AsyncIterator[TestServer]:
    server = await start_asyncssh_server(directory, **options)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()
        await server._server.wait_closed()  # type: ignore[union-attr]


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[TestServer]:
    """A real OpenSSH sshd for one test."""
    with running_sshd(tmp_path / "sshd") as server:
        yield server


@pytest.fixture
async def asyncssh_server(tmp_path: Path) -> AsyncIterator[TestServer]:
    """An asyncssh server for one test."""
    async with running_asyncssh_server(tmp_path / "asyncssh") as server:
        yield server
