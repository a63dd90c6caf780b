"""Worker-side SSH key material: the deployment's client key, per-VM host keys and pins.

Everything here lives in one directory on the worker (the lead passes `<data_dir>/ssh`), never
in Temporal history, a log line or an activity result:

    <dir>/                     0700
      client_ed25519           0600  the key the control plane logs in to nodes with
      client_ed25519.pub             its public half (what clouds put in authorized_keys)
      host_keys/<vm>           0600  a host key generated for one VM, until it is installed
      known_hosts/<vm>               the host key a VM must present (injected, or pinned)

Host-key trust, strongest first:
(a) the control plane generates the VM's host key (`host_key_for`) and injects it at create
    time (`host_key_cloud_config`, cloud-init user data), so the key is known before first
    contact; its public half is recorded in known_hosts/<vm> at once;
(b) the cloud reports a fingerprint (SshEndpoint.host_key_fingerprint);
(c) neither: the first key seen is pinned (`pin`) and every later contact must match it.

Files are created with O_EXCL-style links, so two workers sharing the directory agree on one key:
whoever links first wins and the other reads the winner's file. Several workers must share this
directory (a volume), or nodes created by one cannot be reached by another.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path

import asyncssh

from providers.ssh_common import fingerprint as fingerprint  # re-exported for its users
from providers.ssh_common import public_line

CLIENT_KEY_NAME = "client_ed25519"
KEY_ALGORITHM = "ssh-ed25519"
KEY_COMMENT = "gpuprov"
# A VM identity becomes a file name here and a directory name on the node: keep it tame.
_VM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}=?")


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


class KeyStore:
    """The worker's SSH key directory. Synchronous (file I/O): async callers use to_thread."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser()

    # ------------------------------------------------------------------ the client key

    def client_key(self) -> asyncssh.SSHKey:
        """The deployment's private client key, generated on first use."""
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
        """A host key for `vm` (the same one on every call): generated worker-side, its public
        half recorded as the key the VM must present. Inject it with host_key_cloud_config."""
        path = self._dir("host_keys") / check_vm_name(vm)
        key = self._read_private(path)
        if key is None:
            fresh = asyncssh.generate_private_key(KEY_ALGORITHM, comment=f"gpuprov-{vm}")
            key = self._create_private(path, fresh)
        self.pin(vm, key.convert_to_public())
        return key

    def forget_private_host_key(self, vm: str) -> None:
        """Drop the private host key once the node has it (after bootstrap)."""
        with contextlib.suppress(FileNotFoundError):
            (self._dir("host_keys") / check_vm_name(vm)).unlink()

    def known_host_key(self, vm: str) -> asyncssh.SSHKey | None:
        """The key `vm` must present: injected or pinned earlier; None if none yet."""
        path = self._dir("known_hosts") / check_vm_name(vm)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as error:
            raise KeyFileError(f"cannot read {path}: {error.strerror}") from None
        try:
            return parse_public_key(text)
        except ValueError:
            raise KeyFileError(f"{path} does not hold an OpenSSH public key") from None

    def pin(self, vm: str, key: asyncssh.SSHKey) -> asyncssh.SSHKey:
        """Record `key` as the one `vm` must present, unless one is recorded already; returns
        the recorded key (compare it with yours: a different one means you lost a race or the
        host changed its key)."""
        path = self._dir("known_hosts") / check_vm_name(vm)
        if _create_exclusive(path, public_line(key) + "\n", 0o644):
            return key
        recorded = self.known_host_key(vm)
        if recorded is None:  # removed between our link and our read: try once more
            _create_exclusive(path, public_line(key) + "\n", 0o644)
            recorded = self.known_host_key(vm)
        assert recorded is not None
        return recorded

    def forget(self, vm: str) -> None:
        """Remove everything recorded for `vm` (the VM is gone for good)."""
        self.forget_private_host_key(vm)
        with contextlib.suppress(FileNotFoundError):
            (self._dir("known_hosts") / check_vm_name(vm)).unlink()

    # ------------------------------------------------------------------ files

    def _dir(self, *parts: str) -> Path:
        path = self.directory.joinpath(*parts)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

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
        winner = self._read_private(path)  # another worker wrote it first
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
