"""The worker's SSH key directory: one client key, per-VM host keys, pins that never move."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncssh
import pytest
import yaml

from activities.ssh_keys import (
    KeyFileError,
    KeyStore,
    check_vm_name,
    fingerprint,
    host_key_cloud_config,
    normalize_fingerprint,
    parse_public_key,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_client_key_is_generated_once_private_and_stable(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "ssh")
    key = store.client_key()
    again = KeyStore(tmp_path / "ssh").client_key()  # another worker process, same directory

    assert key.public_data == again.public_data
    assert mode(tmp_path / "ssh") == 0o700
    assert mode(tmp_path / "ssh" / "client_ed25519") == 0o600
    line = store.client_public_key()
    assert line.startswith("ssh-ed25519 ") and "PRIVATE" not in line
    assert (tmp_path / "ssh" / "client_ed25519.pub").read_text().strip() == line


def test_workers_racing_for_the_client_key_agree_on_one(tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        keys = list(pool.map(lambda _: KeyStore(tmp_path).client_key().public_data, range(16)))
    assert len(set(keys)) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_corrupt_key_file_is_an_error_that_does_not_quote_it(tmp_path: Path) -> None:
    (tmp_path / "client_ed25519").write_text("not a key but maybe a secret")
    with pytest.raises(KeyFileError) as raised:
        KeyStore(tmp_path).client_key()
    assert "secret" not in str(raised.value)


def test_host_key_for_a_vm_is_stable_and_becomes_its_known_host_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    key = store.host_key_for("job-a1-n0-abc123")
    assert store.host_key_for("job-a1-n0-abc123").public_data == key.public_data
    assert mode(tmp_path / "host_keys" / "job-a1-n0-abc123") == 0o600
    known = store.known_host_key("job-a1-n0-abc123")
    assert known is not None and known.public_data == key.public_data
    assert store.known_host_key("other-vm") is None

    store.forget_private_host_key("job-a1-n0-abc123")
    assert not (tmp_path / "host_keys" / "job-a1-n0-abc123").exists()
    assert store.known_host_key("job-a1-n0-abc123") is not None  # the node must still match
    store.forget("job-a1-n0-abc123")
    assert store.known_host_key("job-a1-n0-abc123") is None


def test_the_first_pin_wins_and_a_different_key_never_replaces_it(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
    first = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    second = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    assert store.pin("vm-1", first).public_data == first.public_data
    assert store.pin("vm-1", second).public_data == first.public_data
    recorded = store.known_host_key("vm-1")
    assert recorded is not None and recorded.public_data == first.public_data


def test_cloud_config_installs_exactly_the_generated_host_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path)
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
