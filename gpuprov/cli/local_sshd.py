"""A throwaway OpenSSH sshd on loopback: for `gpuprov demo-ssh` and the SSH tests.

`start_sshd(directory)` runs `/usr/sbin/sshd -D -f <its own config> -E <its own log>` on a free
127.0.0.1 port. Everything it uses lives inside `directory`: an ed25519 host key (and an RSA one
with `rsa_too`), `authorized_keys` holding a client key generated here (its private half in
`client_ed25519`, 0600), the PidFile and the log. `StrictModes no`, since those files sit under
a temp dir; sessions get `HOME=<directory>/home` (sshd's `SetEnv`), so whatever a login installs
"in the home directory" stays inside `directory` too. Nothing of the system's own sshd
(/etc/ssh, port 22) is read or touched.

It needs root (sshd's privilege separation; `/run/sshd` is created) and openssh-server
installed (`make demo-ssh` and `make test` install it with apt-get where /usr/sbin/sshd is
missing); without them `SshdUnavailable` says which. `LocalSshd.stop()` ends the listener
(SIGTERM, then SIGKILL), which ends the sessions it forked.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from providers.ssh_common import public_line

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0
CLIENT_KEY_FILE = "client_ed25519"


class SshdUnavailable(RuntimeError):
    """sshd cannot run here: not installed, or not root. The message says how to fix it."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_private_key(path: Path, key: asyncssh.SSHKey) -> Path:
    path.write_bytes(key.export_private_key("openssh"))
    path.chmod(0o600)
    return path


@dataclass
class LocalSshd:
    """A running SSH server on loopback: where it listens, its keys, the HOME its sessions get."""

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

    @property
    def host_public_key(self) -> str:
        return public_line(self.host_key)

    @property
    def host_fingerprint(self) -> str:
        return self.host_key.get_fingerprint("sha256")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

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
                self._process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def generate_keys(
    directory: Path, authorized: list[asyncssh.SSHKey] | None = None
) -> tuple[asyncssh.SSHKey, asyncssh.SSHKey, Path]:
    """A host key, and a client key written to `directory` and listed (with `authorized`) in
    `directory/authorized_keys`; `directory/home` is created for the sessions."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "home").mkdir(exist_ok=True)
    host_key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuprov-local-host")
    client_key = asyncssh.generate_private_key("ssh-ed25519", comment="gpuprov-local-client")
    client_path = write_private_key(directory / CLIENT_KEY_FILE, client_key)
    lines = [public_line(key) for key in [client_key, *(authorized or [])]]
    (directory / "authorized_keys").write_text("\n".join(lines) + "\n")
    return host_key, client_key, client_path


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


def check_usable() -> None:
    """Raise SshdUnavailable unless sshd is installed and we are root."""
    if not SSHD.exists():
        raise SshdUnavailable(
            f"{SSHD} not found: install openssh-server (`make demo-ssh` and `make test` do: "
            "apt-get install -y openssh-server)"
        )
    if os.geteuid() != 0:
        raise SshdUnavailable("sshd must run as root here (privilege separation): run as root")


def start_sshd(
    directory: Path, authorized: list[asyncssh.SSHKey] | None = None, rsa_too: bool = False
) -> LocalSshd:
    """OpenSSH's sshd on a free loopback port, everything it needs inside `directory`; its own
    client key and `authorized` may log in as root. `rsa_too`: an RSA host key besides the
    ed25519 one (LocalSshd.host_key), listed first, as on a stock Ubuntu host."""
    check_usable()
    PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    host_key, client_key, client_path = generate_keys(directory, authorized)
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
        raise RuntimeError(f"sshd rejects its config {config}: {checked.stderr.strip()}")
    process = subprocess.Popen(
        [str(SSHD), "-D", "-f", str(config), "-E", str(log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = LocalSshd(
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
) -> Iterator[LocalSshd]:
    server = start_sshd(directory, authorized, rsa_too)
    try:
        yield server
    finally:
        server.stop()


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited {process.returncode}:\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"sshd did not listen on {port} within {START_TIMEOUT}s")
