"""The `[providers.ssh]` section for Machines you own (SSH): the hosts, and where claims live.

[providers.ssh]
claims_url = "sqlite:///.data/ssh-claims.db"   # shared by every worker serving this pool

[[providers.ssh.hosts]]
name = "box-1"                    # the offer's instance type and the instance id
host = "10.0.0.5"
user = "ubuntu"
key_path = "/etc/gpuprov/box-1_ed25519"
host_key = "ssh-ed25519 AAAA..."  # or host_key_fingerprint = "SHA256:..."; else first use
gpu = "RTX 4090"
gpu_count = 2
price = 0.9                       # USD per hour as you account for it; no price if unset
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from providers.base import Model
from providers.settings import ProviderSettings

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}=?")
_PUBLIC_KEY = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( .*)?"
)


class SshHost(Model):
    """One machine of the pool. Its shape is what you declare; the node agent reports the
    truth when it registers, and placement checks that report."""

    name: str
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(default="root", min_length=1, max_length=64)
    key_path: str = Field(min_length=1)  # private key (unencrypted) that logs in as `user`
    host_key: str | None = None  # OpenSSH public key line
    host_key_fingerprint: str | None = None  # SHA256:... of its ed25519 key, if it has one
    region: str = Field(default="owned", min_length=1, max_length=64)
    price: float | None = Field(default=None, ge=0)  # per hour, as you account for it
    currency: str = "USD"
    gpu: str | None = None
    gpu_count: int = Field(default=0, ge=0)
    gpu_memory_gb: float | None = Field(default=None, ge=0)
    vcpus: int | None = Field(default=None, ge=0)
    memory_gb: float | None = Field(default=None, ge=0)
    disk_gb: float | None = Field(default=None, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("letters, digits, '.', '_' and '-' only (at most 63)")
        return value

    @field_validator("host_key")
    @classmethod
    def _host_key(cls, value: str | None) -> str | None:
        if value is not None and not _PUBLIC_KEY.fullmatch(value.strip()):
            raise ValueError("expected one OpenSSH public key line, e.g. 'ssh-ed25519 AAAA...'")
        return value.strip() if value is not None else None

    @field_validator("host_key_fingerprint")
    @classmethod
    def _fingerprint(cls, value: str | None) -> str | None:
        if value is not None and not _FINGERPRINT.fullmatch(value.strip()):
            raise ValueError("expected an OpenSSH SHA256 fingerprint, e.g. 'SHA256:...'")
        return value.strip().rstrip("=") if value is not None else None


class SshConfig(ProviderSettings):
    """Machines you own (SSH) settings."""

    hosts: list[SshHost] = Field(default_factory=list)
    ssh_bootstrap: bool = True  # machines you own get the node agent over SSH
    # Claims and pinned host keys. Every worker serving this pool must use the same database:
    # the default SQLite file for workers on one machine, PostgreSQL for several.
    claims_url: str = "sqlite:///.data/ssh-claims.db"
    boot_timeout: float = Field(default=120.0, gt=0)  # until sshd lets us in after a claim
    delete_timeout: float = Field(default=60.0, gt=0)
    poll_interval: float = Field(default=5.0, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)  # one reachability check

    @model_validator(mode="after")
    def _distinct_hosts(self) -> SshConfig:
        names = [host.name for host in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError("host names must be unique")
        places = [(host.host.lower(), host.port) for host in self.hosts]
        if len(set(places)) != len(places):
            raise ValueError("two hosts name the same address and port: one would be claimed twice")
        return self
