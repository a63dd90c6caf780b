"""Wiring shared by worker.py, `gpuprov dev`, the demo and the tests: client, Worker, API."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncssh
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, TelemetryConfig
from temporalio.runtime import Runtime as TemporalRuntime
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.bootstrap import BootstrapActivities, RecordsJoinTokens
from activities.cloud import CloudActivities
from activities.enrolment import Enrolment
from activities.health import HealthActivities
from activities.job_context import JobContextActivities
from activities.k3s import K3sActivities
from activities.liveness import LivenessActivities
from activities.offer_stats import OfferStatsActivities
from activities.reconcile import ReconcileActivities
from activities.registrations import RegistrationActivities
from activities.ssh_keys import KeyFileError, KeyStore, carry_over_pins, read_client_key
from activities.store import StoreActivities
from activities.teams import TeamActivities
from activities.work import WorkActivities
from gpuprov import metrics
from gpuprov.config import (
    CodecSettings,
    ConfigError,
    JobsSettings,
    MetricsSettings,
    Settings,
    SshSettings,
    TemporalSettings,
)
from gpuprov.sdk import pem
from gpuprov.sdk.connection import connect_temporal
from gpuprov.store.capacity import CapacityBackoff, LaunchBudget
from gpuprov.store.db import DatabaseUnavailable, open_database
from gpuprov.store.fences import VmFences
from gpuprov.store.offer_stats import OfferStatsStore
from gpuprov.store.records import Records
from gpuprov.store.secrets import Vault
from gpuprov.store.ssh_records import SshRecords
from gpuprov.store.teams import Teams
from gpuprov.store.work import WorkRecords
from providers import build_all
from providers.base import CloudProvider
from workflows.health import CheckHealth
from workflows.job import ProvisionJob
from workflows.liveness import WatchWorkers
from workflows.offers import PlanOffers
from workflows.reconcile import Reconcile

WORKFLOWS = [ProvisionJob, PlanOffers, Reconcile, CheckHealth, WatchWorkers]

# Waits between tries to reach a dependency (Temporal, the database) at start-up: a process
# started before it (or during its restart) waits for it instead of exiting, the way
# `docker compose up` needs.
START_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0)


def start_backoff(tries: int) -> float:
    return START_BACKOFF[min(tries, len(START_BACKOFF) - 1)]


async def connect(
    settings: TemporalSettings,
    runtime: TemporalRuntime | None = None,
    codec: CodecSettings | None = None,
) -> Client:
    """A client for the cluster (gpuprov/sdk/connection.py: TLS, API key, checked settings); a
    worker built on it reports metrics through `runtime`.

    Pass `settings.codec`: with keys configured, payloads are encrypted (gpuprov/sdk/codec.py), and
    every worker and client of the namespace must use the same keys.
    """
    return await connect_temporal(settings, codec=codec, runtime=runtime)


def metrics_runtime(settings: MetricsSettings) -> TemporalRuntime | None:
    """A Temporal runtime serving Prometheus on `settings.bind` (None when metrics are off).

    The Temporal SDK's own metrics (temporal_*) and gpuprov's (gpuprov/metrics.py, recorded
    through Temporal's metric meters) share its /metrics. Each runtime binds its port once:
    build one per process.
    """
    if settings.bind is None:
        return None
    prometheus = PrometheusConfig(
        bind_address=settings.bind, histogram_bucket_overrides=metrics.HISTOGRAM_BUCKETS
    )
    try:
        return TemporalRuntime(telemetry=TelemetryConfig(metrics=prometheus))
    except ValueError as error:  # bad address, port in use
        raise ConfigError(f"metrics.bind {settings.bind!r}: {error}") from None


HEARTBEAT_THROTTLE = timedelta(seconds=3)


def build_worker(
    client: Client,
    task_queue: str,
    providers: dict[str, CloudProvider],
    records: Records,
    *,
    api_url: str,
    api_ca_pem: str | None = None,
    jobs: JobsSettings | None = None,
    skipped: dict[str, str] | None = None,
    ssh_keys: KeyStore | None = None,
    ssh_bootstrap: set[str] | None = None,
    sandboxed: bool = True,
    workflows: Sequence[type] = tuple(WORKFLOWS),
    **worker_options: Any,
) -> Worker:
    """The gpuprov worker; `worker_options` go to temporalio's Worker unchanged (the benchmark
    raises max_concurrent_activities and max_cached_workflows for 1000 concurrent jobs).

    With `ssh_keys` (the worker's SSH keys, activities/ssh_keys.py; `open_key_store`) the
    worker also runs the SSH bootstrap, for the providers in `ssh_bootstrap`. `api_ca_pem`: the
    CA nodes pin for `api_url` (`[api] ca_file`), handed to every node with its join token.

    `sandboxed` runs workflow code in temporalio's sandbox: the default here, so every test's
    worker has the runtime guard; `running_worker` passes `[temporal] workflow_sandbox`.
    `workflows` replaces the workflow classes (a test runs changed workflow code with it)."""
    jobs = jobs or JobsSettings()
    token_ttl = timedelta(seconds=jobs.join_token_ttl_seconds)
    enrolment = Enrolment(records, api_url, token_ttl, api_ca_pem)
    # The worker reads only whether a secret's name exists: it holds no vault key.
    teams = TeamActivities(
        Teams(records.db), Vault(records.db, {}, None), jobs.budget_check_seconds
    )
    store = StoreActivities(
        records,
        timedelta(seconds=jobs.block_ttl_seconds),
        CapacityBackoff(
            timedelta(seconds=jobs.capacity_backoff_seconds),
            timedelta(seconds=jobs.capacity_backoff_max_seconds),
        ),
        LaunchBudget(
            records.db, jobs.launch_probes, timedelta(seconds=jobs.launch_probe_window_seconds)
        ),
    )
    if ssh_bootstrap and ssh_keys is None:
        raise ValueError("ssh_bootstrap needs ssh_keys (the worker's SSH client key and pins)")
    keys = ssh_keys
    over_ssh = (
        [
            *BootstrapActivities(
                providers, keys, RecordsJoinTokens(records, token_ttl), api_url, api_ca_pem
            ).all(),
            *K3sActivities(providers, keys, jobs.k3s).all(),
        ]
        if keys is not None
        else []
    )
    cloud = CloudActivities(
        providers,
        enrolment,
        skipped,
        ssh_bootstrap=set(ssh_bootstrap or ()),
        keys=keys,
        fences=VmFences(records.db),
    )
    if not sandboxed:
        worker_options.setdefault("workflow_runner", UnsandboxedWorkflowRunner())
    # The SDK holds an activity's beats back to one per 80% of its heartbeat timeout (8 s of
    # the cloud steps' 10 s), which leaves a busy worker 2 s of slack before the server calls
    # the step dead; sent as our Heartbeater beats (every third of the timeout), one late beat
    # is not a timeout.
    worker_options.setdefault("max_heartbeat_throttle_interval", HEARTBEAT_THROTTLE)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(workflows),
        activities=[
            *cloud.all(),
            *over_ssh,
            *store.all(),
            *OfferStatsActivities(
                OfferStatsStore(
                    records.db,
                    timedelta(days=jobs.offer_stats_retention_days),
                    jobs.offer_stats_per_offering,
                )
            ).all(),
            *JobContextActivities(cloud, store, teams).all(),
            *teams.all(),
            *RegistrationActivities(records, api_url, api_ca_pem=api_ca_pem).all(),
            *WorkActivities(WorkRecords(records.db)).all(),
            # The reconciler asks Temporal (through this worker's client) which jobs are live.
            *ReconcileActivities(providers, records, client).all(),
            # The liveness sweep signals jobs through this worker's client too.
            *LivenessActivities(records, client).all(),
            *HealthActivities(providers, records, keys).all(),
        ],
        **worker_options,
    )


def node_ca_pem(ca_file: str | None) -> str | None:
    """`[api] ca_file`'s certificates, checked, as the PEM text nodes pin; None without it."""
    if ca_file is None:
        return None
    setting = f"api.ca_file ({ca_file})"
    data = pem.read(setting, ca_file)
    pem.certificates(setting, data)
    return data.decode("ascii")


def open_records(url: str) -> Records:
    """Connect to the database and bring its schema to the latest migration.

    DatabaseUnavailable, one line without the password, when it cannot be opened or migrated."""
    return Records(open_database(url))


async def open_records_patiently(
    url: str, wait_seconds: float, report: Callable[[str], None], stop: asyncio.Event
) -> Records | None:
    """`open_records`, retried with backoff for up to `wait_seconds`, calling `report` with one
    line per failed try; DatabaseUnavailable once the time is up, None when `stop` is set."""
    deadline = asyncio.get_running_loop().time() + wait_seconds
    for tries in itertools.count():
        try:
            return await asyncio.to_thread(open_records, url)
        except DatabaseUnavailable as error:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise DatabaseUnavailable(f"{error} (gave up after {wait_seconds:g}s)") from None
            delay = min(start_backoff(tries), left)
            report(f"{error}; retrying in {delay:.3g}s")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            return None
    return None


SSH_KEY_SETTINGS = "ssh.client_key_file, ssh.client_key or GPUPROV_SSH__CLIENT_KEY"


def open_key_store(
    settings: SshSettings, data_dir: Path, records: Records, *, bootstrap: bool
) -> tuple[KeyStore, str]:
    """The worker's KeyStore (pins in the database) and how its start-up line describes the
    client key. ConfigError, naming the setting and never quoting a key, when it cannot work.

    A configured key is the deployment's: recorded for it, so a worker that generated its own
    learns of it. Without one, the worker's key is generated in <data_dir>/ssh, which serves
    one worker only: where a provider bootstraps over SSH (`bootstrap`), that key is recorded
    too, and a worker whose generated key is not the one the deployment already uses refuses
    to start rather than create nodes the other workers cannot reach."""
    pins = SshRecords(records.db)
    directory = data_dir / "ssh"
    carry_over_pins(directory, pins)
    if settings.configured:
        keys = KeyStore(pins, client_key=_configured_client_key(settings))
        source = "from ssh.client_key_file" if settings.client_key_file else "from ssh.client_key"
    else:
        keys = KeyStore(pins, directory=directory)
        if not bootstrap:
            return keys, "SSH client key: none configured (no provider bootstraps over SSH)"
        source = f"generated in {directory} (one worker only; several need {SSH_KEY_SETTINGS})"
    try:
        key = keys.client_key()
    except KeyFileError as error:
        message = f"ssh.client_key is not set, and this worker's own key: {error}"
        raise ConfigError(message) from None
    fingerprint = key.get_fingerprint("sha256")
    other = pins.register_client_key(
        fingerprint,
        keys.client_public_key(),
        source="generated" if keys.generated else "configured",
        host=socket.gethostname(),
    )
    if other is not None:
        raise ConfigError(
            f"ssh.client_key is not set, and the key this worker generated ({fingerprint} in "
            f"{directory}) is not the {other.fingerprint} this deployment's workers use "
            f"(recorded by {other.host} at {other.registered_at:%Y-%m-%d %H:%M} UTC): give "
            f"every worker the deployment's key in {SSH_KEY_SETTINGS}"
        )
    return keys, f"SSH client key {fingerprint} {source}"


def _configured_client_key(settings: SshSettings) -> asyncssh.SSHKey:
    if settings.client_key is not None:
        try:
            return read_client_key(settings.client_key.get_secret_value())
        except ValueError as error:
            raise ConfigError(f"ssh.client_key: {error}") from None
    path = Path(str(settings.client_key_file)).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"ssh.client_key_file ({path}): {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"ssh.client_key_file ({path}): not a text file") from None
    try:
        return read_client_key(text)
    except ValueError as error:
        raise ConfigError(f"ssh.client_key_file ({path}): {error}") from None


@dataclass
class Runtime:
    worker: Worker
    records: Records
    providers: dict[str, CloudProvider]
    skipped: dict[str, str]
    ssh_key: str  # the client key, for the start-up line (its fingerprint, never the key)


@asynccontextmanager
async def running_worker(
    client: Client, settings: Settings, records: Records | None = None
) -> AsyncIterator[Runtime]:
    """Build the providers (and the records, unless given) from `settings`, run a worker until
    the block exits; the records are closed with it."""
    if records is None:
        records = open_records(settings.database_url)
    built = build_all(settings.providers)
    providers = built.providers
    ssh_bootstrap = {
        provider_id
        for provider_id in providers
        if (section := settings.providers.section(provider_id)) is not None
        and section.ssh_bootstrap
    }
    try:
        keys, ssh_key = open_key_store(
            settings.ssh, Path(settings.temporal.data_dir), records, bootstrap=bool(ssh_bootstrap)
        )
        worker = build_worker(
            client,
            settings.temporal.task_queue,
            providers,
            records,
            api_url=settings.api.url,
            api_ca_pem=node_ca_pem(settings.api.ca_file),
            jobs=settings.jobs,
            skipped=built.skipped,
            ssh_keys=keys,
            max_concurrent_activities=settings.temporal.max_concurrent_activities,
            max_cached_workflows=settings.temporal.max_cached_workflows,
            sandboxed=settings.temporal.workflow_sandbox,
            ssh_bootstrap=ssh_bootstrap,
        )
        async with worker:
            yield Runtime(
                worker=worker,
                records=records,
                providers=providers,
                skipped=built.skipped,
                ssh_key=ssh_key,
            )
    finally:
        await _close(providers, records)


async def _close(providers: dict[str, CloudProvider], records: Records) -> None:
    for provider in providers.values():
        await provider.aclose()
    records.db.dispose()
