"""Settings: one `gpuprov.toml` (path by flag or GPUPROV_CONFIG) plus environment overrides.

Sections: `[temporal]`, `[database]`, `[api]`, `[jobs]`, `[metrics]`, `[reconcile]`, `[workers]`,
`[codec]`, `[ssh]`, `[secrets]`, `[providers.<id>]`. Any setting can be overridden by an
environment variable named after its path with double underscores, e.g.
`GPUPROV_TEMPORAL__ADDRESS=temporal:7233`, `GPUPROV_METRICS__BIND=0.0.0.0:9464` or
`GPUPROV_CODEC__KEYS='{k1 = "<base64>"}'`.
Arrays and inline tables are read as TOML literals; every other value is text that the setting's
type converts (numbers, booleans), so a numeric-looking string setting stays a string.
"""

from __future__ import annotations

import base64
import binascii
import keyword
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from gpuprov import contract
from gpuprov.models import format_validation_error, read_bounded_text
from providers import config_models
from providers.base import Model

# The fake cloud's models, where the demo, the benchmark and tests have always imported them.
from providers.fake.config import (  # noqa: F401
    FakeInstanceType,
    FakePrimitive,
    FakeProviderConfig,
    FakeRegion,
    FaultEffect,
    FaultRule,
)
from providers.settings import ProviderSettings

ENV_PREFIX = "GPUPROV_"
CONFIG_ENV = "GPUPROV_CONFIG"
API_KEY_ENV = "GPUPROV_API_KEY"  # [client] api_key, where GPUPROV_CLIENT__API_KEY is not set
MAX_CONFIG_FILE_BYTES = 1024 * 1024  # a config is a few KiB; `--config /dev/zero` must end

# Durations end up in timedeltas, database timestamps and Temporal timers: bounded well inside
# all three, and inside what an operator means (a join token is a secret: a week at most).
MAX_TTL_SECONDS = 30 * 24 * 3600
MAX_JOIN_TOKEN_TTL_SECONDS = 7 * 24 * 3600
MAX_DATABASE_WAIT_SECONDS = 3600.0
Port = Annotated[int, Field(ge=1, le=65535)]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the setting."""


class TemporalTlsSettings(Model):
    """TLS to the Temporal frontend (`[temporal.tls]`; gpuprov/sdk/connection.py reads it).

    Each PEM comes from a file (`*_file`) or inline (the PEM text itself, e.g. from
    GPUPROV_TEMPORAL__TLS__CLIENT_KEY in a container's secret environment), never both.
    `enabled` None: TLS is on as soon as any of these, or `[temporal] api_key`, is set.
    """

    enabled: bool | None = None
    client_cert_file: str | None = None  # mTLS: this process's certificate (chain)
    client_cert: str | None = None
    client_key_file: str | None = None  # ... and its private key (unencrypted PEM)
    client_key: SecretStr | None = None
    server_ca_file: str | None = None  # the CA the server's certificate must chain to;
    server_ca: str | None = None  # none: the system's CAs (Temporal Cloud)
    server_name: str | None = None  # SNI and the name checked on the server's certificate

    @model_validator(mode="after")
    def _one_source_each(self) -> TemporalTlsSettings:
        for name in ("client_cert", "client_key", "server_ca"):
            if getattr(self, name) is not None and getattr(self, f"{name}_file") is not None:
                raise ValueError(f"give {name} or {name}_file, not both")
        has_cert = self.client_cert is not None or self.client_cert_file is not None
        has_key = self.client_key is not None or self.client_key_file is not None
        if has_cert != has_key:
            raise ValueError("client_cert(_file) and client_key(_file) go together (mTLS)")
        return self

    @property
    def configured(self) -> bool:
        """Any certificate, key, CA or server name is set."""
        return any(value is not None for name, value in self if name != "enabled")


_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+")


def check_address(address: str) -> str:
    host, colon, port = address.rpartition(":")
    if not colon or not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port with a port 1-65535, got {address!r}")
    return address


class TemporalSettings(Model):
    address: Annotated[str, Field(max_length=255), AfterValidator(check_address)] = "localhost:7233"
    namespace: str = Field(default="default", min_length=1, max_length=255)
    task_queue: str = Field(default=contract.DEFAULT_TASK_QUEUE, min_length=1, max_length=255)
    tls: TemporalTlsSettings = Field(default_factory=TemporalTlsSettings)
    # Temporal Cloud's API-key authentication (sent as a bearer token; TLS turns on with it):
    # inline (GPUPROV_TEMPORAL__API_KEY) or a file holding only the key.
    api_key: SecretStr | None = None
    api_key_file: str | None = None
    ui_port: Port = 8233  # the dev server's Web UI (gpuprov dev / demo)
    # The dev server's SQLite file and the default database live here. ".data" (relative to the
    # current directory) only for settings built in code: load_settings always fills it in
    # (relative to the config file, or a per-user directory; see the module docstring).
    data_dir: str = Field(default=".data", min_length=1)
    # Worker slots. A waiting job holds an activity slot for its whole boot (wait_running), so
    # max_concurrent_activities bounds the jobs one worker can have booting at once.
    max_concurrent_activities: int = Field(default=500, ge=1, le=100_000)
    max_cached_workflows: int = Field(default=1000, ge=0, le=1_000_000)
    # Run workflow code inside temporalio's sandbox (a runtime guard against non-determinism).
    # Off by default: the sandbox costs about a quarter of the worker's CPU per job, and the
    # worker is GIL-bound (docs/performance.md). The guard stays where it catches mistakes:
    # the test suite runs every workflow sandboxed, and tests/workflows/test_determinism.py
    # checks every module under workflows/ for clocks, randomness and I/O.
    workflow_sandbox: bool = False

    @model_validator(mode="after")
    def _one_api_key_source(self) -> TemporalSettings:
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("give api_key or api_key_file, not both")
        return self


# What gpuprov can open: SQLite, and PostgreSQL through psycopg 3 (db.py reads plain
# postgresql:// and postgres:// as postgresql+psycopg://).
DATABASE_DRIVERS = ("sqlite", "sqlite+pysqlite", "postgres", "postgresql", "postgresql+psycopg")


def _check_database_url(url: str | None) -> str | None:
    # The messages never quote the URL: it may carry the password.
    if url is None:
        return None
    try:
        parsed = make_url(url)
        port = parsed.port
    except (ArgumentError, ValueError):
        raise ValueError(
            "not a database URL: expected sqlite:///path/to/file.db or "
            "postgresql://user:password@host:5432/database"
        ) from None
    if parsed.drivername not in DATABASE_DRIVERS:
        raise ValueError(
            f"unsupported database {parsed.drivername!r}: gpuprov opens sqlite:///... and "
            "postgresql://... (psycopg 3)"
        )
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port {port} is not 1-65535")
    return url


class DatabaseSettings(Model):
    # SQLite by default (a file in the data dir); PostgreSQL in production, e.g.
    # postgresql+psycopg://gpuprov:...@db:5432/gpuprov
    url: Annotated[str | None, AfterValidator(_check_database_url)] = None
    # How long the worker and `gpuprov api` wait at start for the database to answer (retrying
    # with backoff, a line per try) before they give up.
    wait_seconds: float = Field(default=120.0, ge=0, le=MAX_DATABASE_WAIT_SECONDS)


def _check_public_url(url: str | None) -> str | None:
    """Nodes reach the API at this URL (their agents speak HTTP and HTTPS only), and it is
    written into every node's user data and logs: no credentials in it. The messages never
    quote it."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError("not a URL: expected http(s)://host[:port]") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"must be http:// or https://, not {parts.scheme or 'no'} scheme")
    if not parts.hostname:
        raise ValueError("names no host: expected http(s)://host[:port]")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (user:password@): the API takes none")
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"port {port} is not 1-65535")
    return url


def _check_ui_url(url: str | None) -> str | None:
    """A link shown in the dashboard: an http(s) URL with a host and no credentials."""
    return _check_public_url(url)


class ApiSettings(Model):
    host: str = Field(default="127.0.0.1", min_length=1, max_length=255)
    port: Port = 8080
    # The URL booted nodes use to reach the API (http or https, no credentials); defaults to
    # http(s)://host:port.
    public_url: Annotated[str | None, AfterValidator(_check_public_url)] = None
    # HTTPS: the API's certificate (chain) and private key, PEM files. Without them it serves
    # plain HTTP (behind a TLS-terminating proxy, or on a private network).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # The CA (PEM) that signed the certificate nodes see at `url`, where it is a private one:
    # every node gets it (user data, or the SSH bootstrap) and its agent pins it (--ca-file).
    # Without it nodes trust their system's CAs.
    ca_file: str | None = None
    # The Temporal UI's address (http(s)://host:port), for the dashboard's link from each job to
    # its workflow there. `gpuprov dev` and `demo` set it to their dev server's UI.
    temporal_ui_url: Annotated[str | None, AfterValidator(_check_ui_url)] = None

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> ApiSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together (HTTPS)")
        if self.ca_file is not None and not self.url.startswith("https://"):
            raise ValueError(f"ca_file pins the CA of an https API, but nodes use {self.url}")
        return self

    @property
    def https(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def url(self) -> str:
        scheme = "https" if self.https else "http"
        return self.public_url or f"{scheme}://{self.host}:{self.port}"


class ClientSettings(Model):
    """How the user commands (`gpuprov logs`, `cost`, `workers`, `orphans`) reach the
    control-plane API (`[client]`; gpuprov/sdk/api_client.py). With an `api_key` they read over
    the API and never open the database, so a user needs no database credentials; without one
    they read the database directly (the embedded default, or an operator on the box)."""

    # The API's URL; None: `[api]`'s own (`public_url`, else http(s)://host:port).
    api_url: Annotated[str | None, AfterValidator(_check_public_url)] = None
    # An operator API key (`gpuprov apikey create`): GPUPROV_CLIENT__API_KEY or GPUPROV_API_KEY.
    api_key: SecretStr | None = None
    # The CA (PEM) the API's certificate chains to, for https; None: `[api] ca_file`, else the
    # system's CAs.
    ca_file: str | None = None


class JobsSettings(Model):
    """How long shared state lives, and how a job's work is stopped and its output kept."""

    # A stockout steers other jobs this long.
    block_ttl_seconds: int = Field(default=900, ge=1, le=MAX_TTL_SECONDS)
    # A Capacity block backs off per offering instead: this long, doubled per failure in a row
    # once the last block lapsed, at most the second (gpuprov/store/capacity.py).
    capacity_backoff_seconds: int = Field(default=120, ge=1, le=MAX_TTL_SECONDS)
    capacity_backoff_max_seconds: int = Field(default=1800, ge=1, le=MAX_TTL_SECONDS)
    # Once a sold-out offering's block lapses, at most this many creates per window try it,
    # across every job; the others wait for their outcome.
    launch_probes: int = Field(default=2, ge=1, le=1000)
    launch_probe_window_seconds: int = Field(default=60, ge=1, le=MAX_TTL_SECONDS)
    # Every attempt's outcome is kept per offering this long, at most this many per offering
    # (the offer statistics: `gpuprov offers`, placement.order = "ready_time", hedge "auto").
    offer_stats_retention_days: int = Field(default=14, ge=1, le=3650)
    offer_stats_per_offering: int = Field(default=500, ge=1, le=100_000)
    join_token_ttl_seconds: int = Field(default=3600, ge=1, le=MAX_JOIN_TOKEN_TTL_SECONDS)
    # A job whose team has a monthly budget reads the team's spend this often while it holds
    # machines (past the budget: released or warned, by the team's on_exceed).
    budget_check_seconds: int = Field(default=300, ge=1, le=MAX_TTL_SECONDS)
    # The output a job keeps (gpuprov logs): past it, its oldest output is dropped.
    log_cap_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1024**4)
    # A stopped node's work gets SIGTERM, then this long, then SIGKILL. A job waits 90 s for
    # its nodes to report the end before it tears them down anyway.
    # At most 60 s: a job waits 90 s for its nodes to report their work stopped before it frees
    # them (an existing worker goes back to idle): the grace must end well within that.
    stop_grace_seconds: float = Field(default=30.0, ge=0, le=60)
    k3s: K3sSettings = Field(default_factory=lambda: K3sSettings())

    @field_validator("capacity_backoff_max_seconds")
    @classmethod
    def _longest_not_shorter(cls, longest: int, info: ValidationInfo) -> int:
        initial = info.data.get("capacity_backoff_seconds")
        if initial is not None and longest < initial:
            raise ValueError(f"must be at least capacity_backoff_seconds ({initial})")
        return longest


class K3sSettings(Model):
    """The k3s profile (`profile: k3s` in a job spec): where the installer comes from and where
    k3s keeps its state on the nodes (the installer's own defaults)."""

    installer_url: str = "https://get.k3s.io"
    data_dir: str = "/var/lib/rancher/k3s"
    kubeconfig: str = "/etc/rancher/k3s/k3s.yaml"
    api_port: Port = 6443
    install_timeout_seconds: float = Field(default=600.0, gt=0, le=24 * 3600)


class ReconcileSettings(Model):
    """The orphan reconciler's Schedule (gpuprov/engine/schedules.py, applied by `gpuprov setup`,
    `gpuprov schedules apply` and `gpuprov dev`)."""

    # One pass this often (overlaps are skipped).
    every_seconds: int = Field(default=300, ge=1, le=24 * 3600)
    # Younger unowned machines are left alone.
    grace_seconds: float = Field(default=600.0, ge=0, le=MAX_TTL_SECONDS)


KEEP_ALIVE_MARGIN = 15.0  # seconds past one heartbeat interval


class WorkersSettings(Model):
    """Worker liveness (gpuprov/store/liveness.py): how often agents heartbeat (the API tells them),
    when a silent one is lost, and how often the `gpuprov-liveness` Schedule sweeps."""

    heartbeat_interval_seconds: float = Field(default=30.0, gt=0, le=3600)
    lost_after_seconds: float = Field(default=90.0, gt=0)
    sweep_every_seconds: int = Field(default=30, ge=1)
    # Each heartbeat answered renews the node's lease for this long (None: lost_after_seconds).
    # A node whose lease lapses (cut off from the API) stops its work; a new attempt's work
    # never starts before an old node's lease and stop grace period are over.
    lease_seconds: float | None = Field(default=None, gt=0, le=24 * 3600)

    @model_validator(mode="after")
    def _lost_after_a_missed_beat(self) -> WorkersSettings:
        if self.lost_after_seconds <= self.heartbeat_interval_seconds:
            raise ValueError(
                "lost_after_seconds must be longer than heartbeat_interval_seconds "
                "(a worker is lost only after missing heartbeats)"
            )
        if self.lease_seconds is not None and self.lease_seconds <= self.heartbeat_interval_seconds:
            raise ValueError(
                "lease_seconds must be longer than heartbeat_interval_seconds "
                "(one late heartbeat must not stop a node's work)"
            )
        return self

    @property
    def lease(self) -> float:
        """The lease each heartbeat grants, in seconds."""
        return self.lease_seconds if self.lease_seconds is not None else self.lost_after_seconds

    @property
    def keep_alive(self) -> float:
        """How long the API keeps an agent's idle connection open, in seconds: one heartbeat
        interval and a margin, so every heartbeat goes over the connection the last one used
        (a new TCP connection per heartbeat cost the API more than the heartbeat itself)."""
        return self.heartbeat_interval_seconds + KEEP_ALIVE_MARGIN


class MetricsSettings(Model):
    """The worker's Prometheus endpoint: Temporal SDK metrics and gpuprov_* on one /metrics."""

    bind: str | None = None  # host:port, e.g. "0.0.0.0:9464"; None = no endpoint


_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
ENCRYPTION_KEY_BYTES = 32


def _check_encryption_key(value: SecretStr) -> SecretStr:
    # The messages never quote the value: it is a secret.
    try:
        key = base64.b64decode(value.get_secret_value().strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64 (expected base64 of 32 random bytes)") from None
    if len(key) != ENCRYPTION_KEY_BYTES:
        raise ValueError(
            f"decodes to {len(key)} bytes; AES-256 needs {ENCRYPTION_KEY_BYTES} "
            "(base64 of 32 random bytes)"
        )
    return value


EncryptionKey = Annotated[SecretStr, AfterValidator(_check_encryption_key)]


class KeyRing(Model):
    """AES-256 keys by id, and the one new data is encrypted with: what `[codec]` and
    `[secrets]` share. `keys` maps a key id to base64 of 32 random bytes; `active_key` names
    the key new data is encrypted with (None: nothing new is, but the keys still decrypt).
    Keep old keys listed after a rotation: what was encrypted with them names them."""

    keys: dict[str, EncryptionKey] = Field(default_factory=dict)
    active_key: str | None = None

    @model_validator(mode="after")
    def _active_key_is_a_key(self) -> KeyRing:
        for key_id in self.keys:
            if not _KEY_ID.fullmatch(key_id):
                raise ValueError(
                    f"keys: key id {key_id!r} must be 1-64 letters, digits, '.', '_' or '-'"
                )
        if self.active_key is not None and self.active_key not in self.keys:
            known = ", ".join(sorted(self.keys)) or "none"
            raise ValueError(
                f"active_key {self.active_key!r} is not one of the keys (configured: {known})"
            )
        return self

    def key_bytes(self) -> dict[str, bytes]:
        return {
            key_id: base64.b64decode(key.get_secret_value().strip())
            for key_id, key in self.keys.items()
        }


class CodecSettings(KeyRing):
    """Payload encryption (gpuprov/sdk/codec.py) and the codec server the Temporal UI calls.
    Histories encrypted with a key name it: keep old keys listed after a rotation."""

    # `gpuprov codec-server` (and `gpuprov dev` when keys are set).
    host: str = "127.0.0.1"
    port: Port = 8081
    # Browser origins allowed to call the codec server (CORS): the Temporal UI's address.
    # Empty: the local UI, http://localhost:<temporal.ui_port> and http://127.0.0.1:<...>.
    ui_origins: list[str] = Field(default_factory=list)

    @property
    def enabled(self) -> bool:
        """New payloads are encrypted."""
        return self.active_key is not None


class SecretsSettings(KeyRing):
    """The vault's keys (gpuprov/store/secrets.py): `keys` maps a key id to base64 of 32 random
    bytes, `active_key` names the one new values are encrypted with. Without an active key,
    `gpuprov secret set` is refused; keep old keys listed after a rotation (each stored value
    names its key). Only the API holds them: it stores what `secret set` sends and hands the
    values to the nodes with their work. `GPUPROV_SECRETS__KEYS='{k1 = "<base64>"}'` and
    `GPUPROV_SECRETS__ACTIVE_KEY=k1` set them from the environment."""


class SshSettings(Model):
    """The deployment's SSH client key: what every worker logs in to nodes with over SSH
    (bootstrap, k3s, health probes; activities/ssh_keys.py).

    The private key's text (OpenSSH or PEM, unencrypted) inline, e.g. from
    GPUPROV_SSH__CLIENT_KEY in a secret store's environment, or a file holding it; never both.
    Neither: a worker generates a key in <temporal.data_dir>/ssh, which serves one worker only
    (a node one worker created authorizes that worker's key alone)."""

    client_key: SecretStr | None = None
    client_key_file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SshSettings:
        if self.client_key is not None and self.client_key_file is not None:
            raise ValueError("give client_key or client_key_file, not both")
        return self

    @property
    def configured(self) -> bool:
        return self.client_key is not None or self.client_key_file is not None


class _ProviderSections(Model):
    """The `[providers.<id>]` sections: one optional field per cloud of the registry."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)

    def section(self, provider_id: str) -> ProviderSettings | None:
        """The section of `provider_id` (its TOML name), or None where absent or unknown."""
        for name, field in type(self).model_fields.items():
            if (field.alias or name) == provider_id:
                return getattr(self, name)
        return None

    def enabled_ids(self) -> list[str]:
        return [
            field.alias or name
            for name, field in type(self).model_fields.items()
            if (section := getattr(self, name)) is not None and section.enabled
        ]


def _providers_settings() -> type[_ProviderSections]:
    """ProvidersSettings, derived from the cloud registry (providers.CLOUDS): a section per
    cloud, keyed by provider id; an absent section is a cloud this deployment does not use.
    An id that is a Python keyword (`lambda`) gets a trailing underscore as its field name."""
    fields: dict[str, Any] = {
        (f"{provider_id}_" if keyword.iskeyword(provider_id) else provider_id): (
            model | None,
            Field(default=None, alias=provider_id),
        )
        for provider_id, model in config_models().items()
    }
    return create_model(
        "ProvidersSettings", __base__=_ProviderSections, __module__=__name__, **fields
    )


ProvidersSettings = _providers_settings()


class Settings(Model):
    temporal: TemporalSettings = Field(default_factory=TemporalSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    client: ClientSettings = Field(default_factory=ClientSettings)
    jobs: JobsSettings = Field(default_factory=JobsSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    workers: WorkersSettings = Field(default_factory=WorkersSettings)
    codec: CodecSettings = Field(default_factory=CodecSettings)
    ssh: SshSettings = Field(default_factory=SshSettings)
    secrets: SecretsSettings = Field(default_factory=SecretsSettings)
    providers: ProvidersSettings = Field(default_factory=ProvidersSettings)

    @property
    def database_url(self) -> str:
        return self.database.url or f"sqlite:///{self.temporal.data_dir}/gpuprov.db"

    @property
    def client_api_url(self) -> str:
        """Where the user commands reach the API: `[client] api_url`, else `[api]`'s URL."""
        return self.client.api_url or self.api.url

    @property
    def client_ca_file(self) -> str | None:
        return self.client.ca_file if self.client.ca_file is not None else self.api.ca_file


def default_data_dir(env: Mapping[str, str]) -> str:
    """The per-user data directory: $XDG_DATA_HOME/gpuprov, else ~/.local/share/gpuprov
    (the XDG Base Directory specification's default)."""
    base = env.get("XDG_DATA_HOME")
    if base and Path(base).is_absolute():  # the spec says a relative one is to be ignored
        return str(Path(base) / "gpuprov")
    home = env.get("HOME")
    root = Path(home) if home else Path.home()
    return str(root / ".local" / "share" / "gpuprov")


def _data_dir_from_file(data: dict[str, Any], path: Path) -> None:
    """A relative `[temporal] data_dir` written in the file is relative to the file."""
    temporal = data.get("temporal")
    if not isinstance(temporal, dict) or not isinstance(temporal.get("data_dir"), str):
        return
    data_dir = Path(temporal["data_dir"]).expanduser()
    if temporal["data_dir"] and not data_dir.is_absolute():
        temporal["data_dir"] = str(path.resolve().parent / data_dir)


def _parse_env_value(raw: str) -> Any:
    """Arrays and inline tables are read as TOML; scalars stay text for pydantic to coerce,
    so `GPUPROV_TEMPORAL__NAMESPACE=2024` stays the string "2024"."""
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    except RecursionError:
        raise ConfigError(f"unreadable value {raw[:40]!r}...: nested too deeply") from None
    except ValueError as error:  # e.g. an integer past Python's digit limit
        raise ConfigError(f"unreadable value {raw[:40]!r}...: {error}") from None
    return value if isinstance(value, list | dict) else raw


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV or "__" not in name:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        target = data
        for part in path[:-1]:
            nested = target.setdefault(part, {})
            if not isinstance(nested, dict):
                raise ConfigError(f"{name}: {part} is not a section")
            target = nested
        target[path[-1]] = _parse_env_value(raw)


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read the TOML file (flag, then GPUPROV_CONFIG, else defaults) and apply env overrides."""
    env = os.environ if env is None else env
    path = path or env.get(CONFIG_ENV)
    data: dict[str, Any] = {}
    if path:
        try:
            data = tomllib.loads(read_bounded_text(Path(path), MAX_CONFIG_FILE_BYTES))
        except OSError as error:
            raise ConfigError(f"cannot read config {path}: {error.strerror or error}") from None
        except UnicodeDecodeError as error:
            raise ConfigError(f"config {path} is not UTF-8 text: {error.reason}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"malformed config {path}: {error}") from None
        except RecursionError:
            raise ConfigError(f"malformed config {path}: nested too deeply") from None
        except ValueError as error:  # e.g. an integer past Python's digit limit
            raise ConfigError(f"malformed config {path}: {error}") from None
        _data_dir_from_file(data, Path(path))
    if env.get(API_KEY_ENV):
        client = data.setdefault("client", {})
        if isinstance(client, dict):
            client["api_key"] = env[API_KEY_ENV]
    _apply_env(data, env)
    temporal = data.setdefault("temporal", {})
    if isinstance(temporal, dict) and "data_dir" not in temporal:
        temporal["data_dir"] = default_data_dir(env)
    try:
        return Settings.model_validate(data)
    except ValidationError as error:
        raise ConfigError(f"invalid config: {format_validation_error(error)}") from None
