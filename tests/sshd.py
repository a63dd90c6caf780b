"""Real SSH servers on loopback for tests: OpenSSH's sshd, and an asyncssh server.

`start_sshd(directory)` runs `/usr/sbin/sshd -D -f <its own config>` on a free 127.0.0.1 port with
its own ed25519 host key, authorized_keys and PidFile, all inside `directory` (`StrictModes no`,
since they live under a temp dir). Sessions get `HOME=<directory>/home` (sshd's `SetEnv`), so
what a test installs "in the home directory" stays in the temp dir. It needs root (privilege
separation; `/run/sshd` is created) and openssh-server installed (`make test` installs it);
without them the tests fail with a message, never skip.

`start_asyncssh_server(directory)` is the second implementation: an asyncssh server whose exec
requests run `/bin/sh -c <command>` locally with the same HOME convention.

Both hand back a `TestServer` with the host and client keys; stop them with `.stop()` (or use
the context managers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh
import pytest

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT = 10.0
# What sshd gives sessions (no pyenv shims): the node agent runs with the system python3.
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_private_key(path: Path, key: asyncssh.SSHKey) -> Path:
    path.write_bytes(key.export_private_key("openssh"))
    path.chmod(0o600)
    return path


def public_line(key: asyncssh.SSHKey) -> str:
    return key.export_public_key("openssh").decode().strip()


@dataclass
class TestServer:
    """A running SSH server: where it listens, its keys, the HOME its sessions get."""

    __test__ = False  # not a test class, despite the name

    host: str
    port: int
    user: str
    directory: Path
    home: Path
    host_key: asyncssh.SSHKey  # private; its public half is what clients must verify
    client_key: asyncssh.SSHKey  # authorized to log in as `user`
    client_key_path: Path
    log_path: Path | None = None
    _process: subprocess.Popen[bytes] | None = None
    _server: asyncssh.SSHAcceptor | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def host_public_key(self) -> str:
        return public_line(self.host_key)

    @property
    def host_fingerprint(self) -> str:
        return self.host_key.get_fingerprint("sha256")

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def authorize(self, key: asyncssh.SSHKey) -> None:
        """Add a client key to authorized_keys (sshd reads the file on every login)."""
        with (self.directory / "authorized_keys").open("a") as file:
            file.write(public_line(key) + "\n")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._server is not None:
            self._server.close()


def _keys(
    directory: Path, authorized: list[asyncssh.SSHKey] | None = None
) -> tuple[asyncssh.SSHKey, asyncssh.SSHKey, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "home").mkdir(exist_ok=True)
    host_key = asyncssh.generate_private_key("ssh-ed25519", comment="test-host")
    client_key = asyncssh.generate_private_key("ssh-ed25519", comment="test-client")
    client_path = write_private_key(directory / "client_ed25519", client_key)
    lines = [public_line(key) for key in [client_key, *(authorized or [])]]
    (directory / "authorized_keys").write_text("\n".join(lines) + "\n")
    return host_key, client_key, client_path


def _wait_listening(port: int, process: subprocess.Popen[bytes] | None, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"sshd exited {process.returncode}:\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"sshd did not listen on {port} within {START_TIMEOUT}s")


def sshd_config(directory: Path, port: int, home: Path, host_key_files: list[str]) -> str:
    return "\n".join(
        [
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            *(f"HostKey {directory / name}" for name in host_key_files),
            f"PidFile {directory / 'sshd.pid'}",
            f"AuthorizedKeysFile {directory / 'authorized_keys'}",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "PrintMotd no",
            "MaxStartups 100",
            f"SetEnv HOME={home}",
            "LogLevel DEBUG1",
            "",
        ]
    )


def start_sshd(
    directory: Path, authorized: list[asyncssh.SSHKey] | None = None, rsa_too: bool = False
) -> TestServer:
    """OpenSSH's sshd on a free loopback port, everything it needs inside `directory`; its own
    client key and `authorized` may log in as root. `rsa_too`: an RSA host key besides the
    ed25519 one (TestServer.host_key), listed first, as on a stock Ubuntu host."""
    if not SSHD.exists():
        pytest.fail(
            f"{SSHD} not found: install openssh-server (make test does: apt-get install -y "
            "openssh-server)",
            pytrace=False,
        )
    if os.geteuid() != 0:
        pytest.fail("the sshd tests run sshd as root (privilege separation)", pytrace=False)
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    host_key, client_key, client_path = _keys(directory, authorized)
    write_private_key(directory / "ssh_host_ed25519_key", host_key)
    key_files = ["ssh_host_ed25519_key"]
    if rsa_too:
        rsa = asyncssh.generate_private_key("ssh-rsa", key_size=2048)
        write_private_key(directory / "ssh_host_rsa_key", rsa)
        key_files.insert(0, "ssh_host_rsa_key")
    port = free_port()
    home = directory / "home"
    config = directory / "sshd_config"
    config.write_text(sshd_config(directory, port, home, key_files))
    log = directory / "sshd.log"
    checked = subprocess.run([str(SSHD), "-t", "-f", str(config)], capture_output=True, text=True)
    if checked.returncode != 0:
        raise RuntimeError(f"sshd rejects its test config: {checked.stderr}")
    process = subprocess.Popen(
        [str(SSHD), "-D", "-f", str(config), "-E", str(log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = TestServer(
        host="127.0.0.1",
        port=port,
        user="root",
        directory=directory,
        home=home,
        host_key=host_key,
        client_key=client_key,
        client_key_path=client_path,
        log_path=log,
        _process=process,
    )
    try:
        _wait_listening(port, process, log)
    except BaseException:
        server.stop()
        raise
    return server


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
    generated_host_key, client_key, client_path = _keys(directory, authorized)
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
