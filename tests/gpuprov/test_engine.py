"""The worker's SSH client key at start-up (`open_key_store`), on SQLite and PostgreSQL: from
configuration like any other credential, else generated for a single worker, and a second
worker with a key of its own refused with one line naming the setting."""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest
from pydantic import SecretStr

from gpuprov.config import ConfigError, SshSettings
from gpuprov.engine.worker import open_key_store
from gpuprov.store.db import Database
from gpuprov.store.records import Records
from gpuprov.store.ssh_records import SshRecords

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

SETTING_NAMES = "ssh.client_key_file, ssh.client_key or GPUPROV_SSH__CLIENT_KEY"


def private_text(key: asyncssh.SSHKey) -> str:
    return key.export_private_key("openssh").decode()


def test_a_configured_key_is_used_recorded_and_described_by_fingerprint_only(
    tmp_path: Path, records: Records
) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    settings = SshSettings(client_key=SecretStr(private_text(key)))

    keys, line = open_key_store(settings, tmp_path, records, bootstrap=True)

    assert keys.client_key().public_data == key.public_data and not keys.generated
    fingerprint = key.get_fingerprint("sha256")
    assert line == f"SSH client key {fingerprint} from ssh.client_key"
    [row] = SshRecords(records.db).client_keys()
    assert (row.fingerprint, row.source) == (fingerprint, "configured")
    assert "PRIVATE" not in row.public_key
    assert not (tmp_path / "ssh").exists(), "nothing generated beside a configured key"


def test_a_key_file_is_read_and_named_in_the_start_up_line(
    tmp_path: Path, records: Records
) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    path = tmp_path / "deploy-key"
    path.write_text(private_text(key))

    keys, line = open_key_store(
        SshSettings(client_key_file=str(path)), tmp_path, records, bootstrap=False
    )

    assert keys.client_key().public_data == key.public_data
    assert line.endswith("from ssh.client_key_file")


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (SshSettings(client_key=SecretStr("hunter2 is no key")), "ssh.client_key: not an"),
        (SshSettings(client_key_file="/nonexistent/key"), "ssh.client_key_file (/nonexistent"),
    ],
)
def test_a_configured_key_that_cannot_work_stops_the_worker_naming_the_setting(
    tmp_path: Path, records: Records, settings: SshSettings, expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        open_key_store(settings, tmp_path, records, bootstrap=True)
    assert str(raised.value).startswith(expected) and "hunter2" not in str(raised.value)
    assert SshRecords(records.db).client_keys() == []


def test_a_key_file_holding_something_else_is_refused_without_quoting_it(
    tmp_path: Path, records: Records
) -> None:
    path = tmp_path / "deploy-key"
    path.write_text("hunter2 secret words\n")
    with pytest.raises(ConfigError) as raised:
        open_key_store(SshSettings(client_key_file=str(path)), tmp_path, records, bootstrap=True)
    message = str(raised.value)
    assert message.startswith(f"ssh.client_key_file ({path}): not an unencrypted")
    assert "hunter2" not in message and "\n" not in message


def test_without_a_configured_key_a_single_worker_generates_one_and_says_it_is_alone(
    tmp_path: Path, records: Records
) -> None:
    keys, line = open_key_store(SshSettings(), tmp_path / "a", records, bootstrap=True)

    assert keys.generated and (tmp_path / "a" / "ssh" / "client_ed25519").exists()
    fingerprint = keys.client_key().get_fingerprint("sha256")
    assert line.startswith(f"SSH client key {fingerprint} generated in {tmp_path / 'a' / 'ssh'}")
    assert "one worker only" in line and SETTING_NAMES in line
    again, _ = open_key_store(SshSettings(), tmp_path / "a", records, bootstrap=True)
    assert again.client_key().public_data == keys.client_key().public_data  # a restart


def test_a_second_worker_with_a_generated_key_refuses_to_start_naming_the_setting(
    tmp_path: Path, records: Records, database_url: str
) -> None:
    first, _ = open_key_store(SshSettings(), tmp_path / "host-a", records, bootstrap=True)
    other_host = Records(Database(database_url))
    try:
        with pytest.raises(ConfigError) as raised:
            open_key_store(SshSettings(), tmp_path / "host-b", other_host, bootstrap=True)
    finally:
        other_host.db.dispose()

    message = str(raised.value)
    assert message.startswith("ssh.client_key is not set")
    assert first.client_key().get_fingerprint("sha256") in message
    assert SETTING_NAMES in message and "\n" not in message
    [row] = SshRecords(records.db).client_keys()
    assert row.fingerprint == first.client_key().get_fingerprint("sha256")


def test_once_a_key_is_configured_a_worker_with_a_generated_one_is_refused(
    tmp_path: Path, records: Records
) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519")
    configured = SshSettings(client_key=SecretStr(private_text(key)))
    open_key_store(configured, tmp_path / "host-a", records, bootstrap=True)

    with pytest.raises(ConfigError) as raised:
        open_key_store(SshSettings(), tmp_path / "host-b", records, bootstrap=True)
    assert key.get_fingerprint("sha256") in str(raised.value)
    open_key_store(configured, tmp_path / "host-c", records, bootstrap=True)  # still fine


def test_a_worker_that_bootstraps_nothing_generates_and_records_nothing(
    tmp_path: Path, records: Records
) -> None:
    keys, line = open_key_store(SshSettings(), tmp_path, records, bootstrap=False)
    assert line == "SSH client key: none configured (no provider bootstraps over SSH)"
    assert not (tmp_path / "ssh").exists()
    assert SshRecords(records.db).client_keys() == []
    assert keys.generated


def test_pins_kept_in_files_by_an_earlier_version_are_carried_over_at_start(
    tmp_path: Path, records: Records
) -> None:
    pinned = asyncssh.generate_private_key("ssh-ed25519")
    known_hosts = tmp_path / "ssh" / "known_hosts"
    known_hosts.mkdir(parents=True)
    (known_hosts / "old-a1-n0-abc123").write_text(pinned.export_public_key().decode())

    keys, _ = open_key_store(SshSettings(), tmp_path, records, bootstrap=False)

    known = keys.known_host_key("old-a1-n0-abc123")
    assert known is not None and known.public_data == pinned.public_data
