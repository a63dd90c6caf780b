"""Worker-side SSH key material: the deployment's client key, per-VM host keys, and pins.

The client key is the deployment's credential for logging in to nodes. Configured
(`[ssh] client_key` or `client_key_file`), every worker has the same one; otherwise a worker
generates one in its own directory, which serves a single worker (gpuprov/engine/worker.py will not
start a worker whose generated key is not the one the deployment already uses):

    <dir>/                     0700   (only without a configured key)
      client_ed25519           0600  the generated client key
      client_ed25519.pub             its public half

Host-key trust, strongest first:
(a) the control plane makes the VM's host key (`host_key_for`) and injects it at create time
    (`host_key_cloud_config`, cloud-init user data), so the key is known before first contact;
    its public half is pinned at once;
(b) the cloud reports a fingerprint (SshEndpoint.host_key_fingerprint);
(c) neither: the first key seen is pinned (`pin`) and every later contact must match it.

Pins are public and live in the database (`HostKeyPins`, gpuprov/store/ssh_records.py): any worker
verifies any VM; the first pin of a VM wins and is never replaced. A VM's injected host key is
not stored anywhere: it is derived from the client key and the VM's name (`derive_host_key`), so
every worker holding the deployment's key makes the same key for the same VM (a create retried
on another worker injects exactly what the first one pinned), and the private half exists only
in the user data handed to the cloud.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

import asyncssh
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from providers.ssh_common import fingerprint as fingerprint  # re-exported for its users
from providers.ssh_common import public_line

CLIENT_KEY_NAME = "client_ed25519"
KEY_ALGORITHM = "ssh-ed25519"
KEY_COMMENT = "gpuprov"
# A VM identity becomes a file name here and a directory name on the node: keep it tame.
_VM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}=?")
# Domain separation for derive_host_key: a key derived here is good for nothing else.
_HOST_KEY_SALT = b"gpuprov ssh host key v1"


class KeyFileError(ValueError):
    """Key material that cannot be read or does not parse (the message names the file only)."""


def check_vm_name(vm: str) -> str:
    if not _VM_NAME.fullmatch(vm) or ".." in vm:
        raise ValueError(f"unusable VM name {vm!r} for SSH key files")
    return vm


def normalize_fingerprint(value: str) -> str:
    """`SHA256:abc` as OpenSSH prints it (trailing `=` dropped); ValueError if not one."""
    text = value.strip()
    if not _FINGERPRINT.fullmatch(text):
        raise ValueError(f"not an OpenSSH SHA256 fingerprint: {text[:80]!r}")
    return text.rstrip("=")


def parse_public_key(text: str) -> asyncssh.SSHKey:
    """One OpenSSH public key line (`ssh-ed25519 AAAA... comment`)."""
    try:
        return asyncssh.import_public_key(text.strip())
    except (asyncssh.KeyImportError, ValueError) as error:
        raise ValueError(f"not an OpenSSH public key: {error}") from None


def read_client_key(text: str) -> asyncssh.SSHKey:
    """A configured client key: unencrypted private key text, OpenSSH or PEM. ValueError
    otherwise, whose message never quotes the text (it may be a secret)."""
    try:
        return asyncssh.import_private_key(text.strip().encode())
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError, ValueError, TypeError):
        raise ValueError("not an unencrypted OpenSSH or PEM private key") from None


def derive_host_key(client_key: asyncssh.SSHKey, vm: str) -> asyncssh.SSHKey:
    """The ed25519 host key of `vm`: HKDF-SHA256 over the client key's OpenSSH private encoding,
    with the VM's name as the context. The same for the same (client key, VM) on every worker,
    unrelated across VMs, and useless without the client key, which logs in to the node anyway.
    """
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=_HOST_KEY_SALT, info=vm.encode()).derive(
        client_key.private_data
    )
    der = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    key = asyncssh.import_private_key(der)
    key.set_comment(f"gpuprov-{vm}")
    return key


def host_key_cloud_config(host_key: asyncssh.SSHKey, authorized_keys: list[str]) -> str:
    """cloud-init user data that installs `host_key` as the node's SSH host key (cc_ssh's
    `ssh_keys`; bootstrap asks for that key's type, so other generated types do not matter)
    and authorizes `authorized_keys`.

    JSON is YAML, so the document needs no YAML library and quotes the PEM exactly. It holds a
    PRIVATE key: build it inside the create activity only, never in the workflow."""
    kind = host_key.algorithm.decode().removeprefix("ssh-")  # ed25519, rsa
    document = {
        "ssh_deletekeys": True,
        "ssh_keys": {
            f"{kind}_private": host_key.export_private_key("openssh").decode(),
            f"{kind}_public": public_line(host_key),
        },
        "ssh_authorized_keys": list(authorized_keys),
    }
    return "#cloud-config\n" + json.dumps(document, indent=2) + "\n"


class HostKeyPins(Protocol):
    """Where pins live: the database (store.ssh_records.SshRecords), shared by every worker."""

    def pin_host_key(self, vm: str, public_key: str) -> str: ...

    def host_key(self, vm: str) -> str | None: ...


class KeyStore:
    """The worker's SSH keys: the client key (configured, or generated in `directory`), the host
    keys it derives per VM, and the pins. Synchronous (file and database I/O): async callers use
    to_thread."""

    def __init__(
        self,
        pins: HostKeyPins,
        *,
        client_key: asyncssh.SSHKey | None = None,
        directory: str | Path | None = None,
    ) -> None:
        if (client_key is None) == (directory is None):
            raise ValueError("a KeyStore needs either a configured client key or a directory")
        self._pins = pins
        self._configured = client_key
        self.directory = Path(directory).expanduser() if directory is not None else None

    @property
    def generated(self) -> bool:
        """The client key is this worker's own (no deployment key configured)."""
        return self._configured is None

    # ------------------------------------------------------------------ the client key

    def client_key(self) -> asyncssh.SSHKey:
        """The private client key: the configured one, else the directory's, generated on
        first use."""
        if self._configured is not None:
            return self._configured
        path = self._dir() / CLIENT_KEY_NAME
        key = self._read_private(path)
        if key is None:
            fresh = asyncssh.generate_private_key(KEY_ALGORITHM, comment=KEY_COMMENT)
            key = self._create_private(path, fresh)
            _write_atomic(path.with_suffix(".pub"), public_line(key) + "\n", 0o644)
        return key

    def client_public_key(self) -> str:
        """The line clouds put in authorized_keys (InstanceSpec.ssh_public_key)."""
        return public_line(self.client_key())

    # ------------------------------------------------------------------ host keys

    def host_key_for(self, vm: str) -> asyncssh.SSHKey:
        """The host key to inject into `vm` (the same one on every call and every worker),
        its public half pinned as the key the VM must present."""
        key = derive_host_key(self.client_key(), check_vm_name(vm))
        self.pin(vm, key.convert_to_public())
        return key

    def known_host_key(self, vm: str) -> asyncssh.SSHKey | None:
        """The key `vm` must present: injected or pinned earlier, by any worker; None if none."""
        recorded = self._pins.host_key(check_vm_name(vm))
        return parse_public_key(recorded) if recorded is not None else None

    def pin(self, vm: str, key: asyncssh.SSHKey) -> asyncssh.SSHKey:
        """Record `key` as the one `vm` must present, unless one is recorded already; returns
        the recorded key (compare it with yours: a different one means you lost a race or the
        host changed its key)."""
        recorded = self._pins.pin_host_key(check_vm_name(vm), public_line(key))
        return parse_public_key(recorded)

    # ------------------------------------------------------------------ files

    def _dir(self) -> Path:
        assert self.directory is not None  # only a generated key lives in a file
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.directory

    def _read_private(self, path: Path) -> asyncssh.SSHKey | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise KeyFileError(f"cannot read {path}: {error.strerror}") from None
        try:
            return asyncssh.import_private_key(data)
        except (asyncssh.KeyImportError, ValueError):
            raise KeyFileError(f"{path} does not hold an unencrypted OpenSSH private key") from None

    def _create_private(self, path: Path, key: asyncssh.SSHKey) -> asyncssh.SSHKey:
        if _create_exclusive(path, key.export_private_key("openssh").decode(), 0o600):
            return key
        winner = self._read_private(path)  # another process wrote it first
        assert winner is not None
        return winner


def _create_exclusive(path: Path, text: str, mode: int) -> bool:
    """Create `path` with `text` only if it does not exist, atomically and complete (written
    to a private temp file, then hard-linked into place). False if it existed."""
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        os.fchmod(handle, mode)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(temp)


def _write_atomic(path: Path, text: str, mode: int) -> None:
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        os.fchmod(handle, mode)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def carry_over_pins(directory: Path, pins: HostKeyPins) -> int:
    """Record in `pins` the host keys an earlier gpuprov pinned in files
    (<directory>/known_hosts/<vm>), so VMs pinned before the upgrade stay verified on every
    worker; the first pin of a VM still wins. The number of files read; the files stay."""
    folder = directory / "known_hosts"
    if not folder.is_dir():
        return 0
    read = 0
    for path in sorted(folder.iterdir()):
        try:
            vm = check_vm_name(path.name)
            key = parse_public_key(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # not a pin file (a temp file, or damaged): nothing to carry over
        pins.pin_host_key(vm, public_line(key))
        read += 1
    return read
