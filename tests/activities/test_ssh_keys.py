"""The worker's SSH keys: one client key (configured, or generated in a directory), host keys
derived per VM, and pins in the database that any worker reads and none can move. Pins run on
SQLite and on PostgreSQL (conftest's `records`)."""

from __future__ import annotations

import json
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncssh
import pytest
import yaml

from activities.ssh_keys import (
    KeyFileError,
    KeyStore,
    carry_over_pins,
    check_vm_name,
    derive_host_key,
    fingerprint,
    host_key_cloud_config,
    normalize_fingerprint,
    parse_public_key,
    read_client_key,
)
from gpuprov.store.db import Database
from gpuprov.store.records import Records
from gpuprov.store.ssh_records import SshRecords
from tests.gpuprov.test_records import snapshot

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

VM = "job-a1-n0-abc123"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def pins(records: Records) -> SshRecords:
    return SshRecords(records.db)


def deployment_key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


# ---------------------------------------------------------------------- the client key


def test_a_generated_client_key_is_made_once_private_and_stable(
    tmp_path: Path, pins: SshRecords
) -> None:
    store = KeyStore(pins, directory=tmp_path / "ssh")
    key = store.client_key()
    again = KeyStore(pins, directory=tmp_path / "ssh").client_key()  # the worker, restarted

    assert store.generated
    assert key.public_data == again.public_data
    assert mode(tmp_path / "ssh") == 0o700
    assert mode(tmp_path / "ssh" / "client_ed25519") == 0o600
    line = store.client_public_key()
    assert line.startswith("ssh-ed25519 ") and "PRIVATE" not in line
    assert (tmp_path / "ssh" / "client_ed25519.pub").read_text().strip() == line


def test_processes_racing_to_generate_the_key_agree_on_one(
    tmp_path: Path, pins: SshRecords
) -> None:
    def generate(_: int) -> bytes:
        return KeyStore(pins, directory=tmp_path).client_key().public_data

    with ThreadPoolExecutor(8) as pool:
        keys = list(pool.map(generate, range(16)))
    assert len(set(keys)) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_corrupt_key_file_is_an_error_that_does_not_quote_it(
    tmp_path: Path, pins: SshRecords
) -> None:
    (tmp_path / "client_ed25519").write_text("not a key but maybe a secret")
    with pytest.raises(KeyFileError) as raised:
        KeyStore(pins, directory=tmp_path).client_key()
    assert "secret" not in str(raised.value)


def test_a_configured_client_key_is_the_one_used_and_nothing_is_written(
    tmp_path: Path, pins: SshRecords
) -> None:
    key = deployment_key()
    store = KeyStore(pins, client_key=key)
    assert not store.generated and store.directory is None
    assert store.client_key() is key
    assert parse_public_key(store.client_public_key()).public_data == key.public_data
    with pytest.raises(ValueError):
        KeyStore(pins, client_key=key, directory=tmp_path)
    with pytest.raises(ValueError):
        KeyStore(pins)


@pytest.mark.parametrize("form", ["openssh", "pkcs8-pem", "pkcs1-pem"])
def test_a_configured_key_reads_openssh_and_pem(form: str) -> None:
    key = asyncssh.generate_private_key("ssh-rsa" if form == "pkcs1-pem" else "ssh-ed25519")
    text = key.export_private_key(form).decode()
    assert read_client_key("\n" + text + "\n").public_data == key.public_data


def test_what_is_not_a_usable_private_key_is_refused_without_quoting_it() -> None:
    key = deployment_key()
    candidates = [
        "hunter2-not-a-key",
        key.export_public_key().decode(),  # the public half by mistake
        key.export_private_key("pkcs8-pem", passphrase="hunter2").decode(),  # encrypted
        key.export_private_key("openssh").decode()[:200],  # cut short
    ]
    for text in candidates:
        with pytest.raises(ValueError) as raised:
            read_client_key(text)
        assert "hunter2" not in str(raised.value) and text[:60] not in str(raised.value)
        assert str(raised.value) == "not an unencrypted OpenSSH or PEM private key"


# ---------------------------------------------------------------------- host keys and pins


def test_a_vms_host_key_is_the_same_on_every_worker_with_the_deployment_key(
    tmp_path: Path, database_url: str, records: Records
) -> None:
    """Worker B (its own engine, no shared directory) makes the very key worker A injected,
    and verifies the VM against A's pin."""
    key = deployment_key()
    worker_a = KeyStore(SshRecords(records.db), client_key=key)
    other_db = Database(database_url)
    worker_b = KeyStore(SshRecords(other_db), client_key=key)

    injected = worker_a.host_key_for(VM)
    assert worker_b.host_key_for(VM).private_data == injected.private_data
    known = worker_b.known_host_key(VM)
    assert known is not None and known.public_data == injected.public_data
    assert worker_b.known_host_key("other-vm") is None
    other_db.dispose()

    assert derive_host_key(key, "job-a1-n1-abc123").public_data != injected.public_data
    assert derive_host_key(deployment_key(), VM).public_data != injected.public_data
    assert injected.algorithm == b"ssh-ed25519" and injected.get_comment() == f"gpuprov-{VM}"


def test_no_private_host_key_is_kept_on_disk_or_in_the_database(
    tmp_path: Path, records: Records, pins: SshRecords
) -> None:
    store = KeyStore(pins, directory=tmp_path / "ssh")
    host_key = store.host_key_for(VM)

    assert sorted(p.name for p in (tmp_path / "ssh").iterdir()) == [
        "client_ed25519",
        "client_ed25519.pub",
    ]
    stored = json.dumps(snapshot(records.db), default=str)
    assert "PRIVATE" not in stored
    assert host_key.export_private_key("openssh").decode().splitlines()[1] not in stored
    [row] = snapshot(records.db)["ssh_host_keys"]
    assert parse_public_key(row[2]).public_data == host_key.public_data


def test_the_first_pin_wins_and_a_different_key_never_replaces_it(pins: SshRecords) -> None:
    store = KeyStore(pins, client_key=deployment_key())
    first = deployment_key().convert_to_public()
    second = deployment_key().convert_to_public()
    assert store.pin("vm-1", first).public_data == first.public_data
    assert store.pin("vm-1", second).public_data == first.public_data
    recorded = store.known_host_key("vm-1")
    assert recorded is not None and recorded.public_data == first.public_data


def test_pins_an_earlier_version_kept_in_files_are_carried_into_the_database(
    tmp_path: Path, pins: SshRecords
) -> None:
    old = tmp_path / "ssh" / "known_hosts"
    old.mkdir(parents=True)
    carried = deployment_key()
    (old / VM).write_text(carried.export_public_key().decode())
    (old / ".tmp-abc").write_text("half written")
    (old / "damaged-a1-n0-abc123").write_text("not a key")
    already = deployment_key().convert_to_public()
    pins.pin_host_key("kept-a1-n0-abc123", already.export_public_key().decode().strip())
    (old / "kept-a1-n0-abc123").write_text(deployment_key().export_public_key().decode())

    assert carry_over_pins(tmp_path / "ssh", pins) == 2
    assert carry_over_pins(tmp_path / "nothing-here", pins) == 0

    store = KeyStore(pins, client_key=deployment_key())
    known = store.known_host_key(VM)
    assert known is not None and known.public_data == carried.public_data
    kept = store.known_host_key("kept-a1-n0-abc123")
    assert kept is not None and kept.public_data == already.public_data, "the database's stands"
    assert store.known_host_key("damaged-a1-n0-abc123") is None


def test_cloud_config_installs_exactly_the_derived_host_key(pins: SshRecords) -> None:
    store = KeyStore(pins, client_key=deployment_key())
    host_key = store.host_key_for("vm-1")
    user_data = host_key_cloud_config(host_key, [store.client_public_key()])

    assert user_data.startswith("#cloud-config\n")
    document = yaml.safe_load(user_data)
    installed = asyncssh.import_private_key(document["ssh_keys"]["ed25519_private"])
    assert installed.public_data == host_key.public_data
    public = parse_public_key(document["ssh_keys"]["ed25519_public"])
    assert public.public_data == host_key.public_data
    assert document["ssh_authorized_keys"] == [store.client_public_key()]
    assert document["ssh_deletekeys"] is True


@pytest.mark.parametrize("name", ["", "../etc", "a/b", "-rf", "a b", "x" * 201, "a;rm"])
def test_unusable_vm_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_vm_name(name)


def test_fingerprints_are_normalised_and_checked() -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    assert normalize_fingerprint(fingerprint(key) + "=") == fingerprint(key)
    with pytest.raises(ValueError):
        normalize_fingerprint("MD5:aa:bb")
