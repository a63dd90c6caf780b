"""`[providers.ssh]`: what a host entry must say, and when the pool cannot be built."""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest
from pydantic import ValidationError

from gpuprov.config import ProvidersSettings, load_settings
from providers import build_all
from providers.settings import MissingCredentials
from providers.ssh.cloud import SshMachines
from providers.ssh.config import SshConfig, SshHost

KEY = asyncssh.generate_private_key("ssh-ed25519")
PUBLIC = KEY.export_public_key("openssh").decode().strip()
FINGERPRINT = KEY.get_fingerprint("sha256")


def host(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {"name": "box-1", "host": "10.0.0.5", "key_path": "/k"}
    data.update(overrides)
    return data


def test_a_minimal_host_gets_operator_defaults() -> None:
    entry = SshHost.model_validate(host())
    assert (entry.port, entry.user, entry.region, entry.price, entry.gpu_count) == (
        22,
        "root",
        "owned",
        None,
        0,
    )


def test_host_key_and_fingerprint_are_checked_for_shape() -> None:
    assert SshHost.model_validate(host(host_key=f"  {PUBLIC}  ")).host_key == PUBLIC
    assert SshHost.model_validate(
        host(host_key_fingerprint=FINGERPRINT + "=")
    ).host_key_fingerprint == (FINGERPRINT)
    for bad in ({"host_key": "AAAA"}, {"host_key_fingerprint": "MD5:00:11"}, {"name": "a b"}):
        with pytest.raises(ValidationError):
            SshHost.model_validate(host(**bad))


def test_two_entries_for_one_machine_are_refused() -> None:
    with pytest.raises(ValidationError, match="unique"):
        SshConfig(hosts=[host(), host(host="10.0.0.6")])
    with pytest.raises(ValidationError, match="same address"):
        SshConfig(hosts=[host(), host(name="box-2", host="10.0.0.5")])


def test_no_hosts_or_an_unreadable_key_skips_the_provider_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(MissingCredentials, match=r"\[\[providers.ssh.hosts\]\]"):
        SshMachines(SshConfig())
    with pytest.raises(MissingCredentials, match="box-1.*missing"):
        SshMachines(SshConfig(hosts=[host(key_path=str(tmp_path / "missing"))]))
    built = build_all(ProvidersSettings(ssh=SshConfig()))
    assert "ssh" in built.skipped and "ssh" not in built.providers


async def test_the_registry_builds_the_pool_from_a_toml_file(tmp_path: Path) -> None:
    key = tmp_path / "box_ed25519"
    key.write_bytes(KEY.export_private_key("openssh"))
    config = tmp_path / "gpuprov.toml"
    config.write_text(
        f"""
[providers.ssh]
claims_url = "sqlite:///{tmp_path / "claims.db"}"

[[providers.ssh.hosts]]
name = "box-1"
host = "127.0.0.1"
port = 2222
user = "ubuntu"
key_path = "{key}"
host_key_fingerprint = "{FINGERPRINT}"
gpu = "RTX 4090"
gpu_count = 2
price = 0.9
labels = {{rack = "a"}}
"""
    )
    built = build_all(load_settings(config, env={}).providers)
    machines = built.providers["ssh"]
    assert isinstance(machines, SshMachines) and built.skipped == {}
    assert machines.config.hosts[0].labels == {"rack": "a"}
    assert machines.sweep_regions() == ["owned"]
    await machines.aclose()
