"""Wiring shared by worker.py, `gpuprov dev`, the demo and the tests: client, Worker, API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

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
from activities.reconcile import ReconcileActivities
from activities.registrations import RegistrationActivities
from activities.ssh_keys import KeyStore
from activities.store import StoreActivities
from gpuprov import metrics
from gpuprov.config import (
    CodecSettings,
    ConfigError,
    JobsSettings,
    MetricsSettings,
    Settings,
    TemporalSettings,
)
from gpuprov.connection import connect_temporal
from gpuprov.db import Database
from gpuprov.records import Records
from providers import build_all
from providers.base import CloudProvider
from workflows.health import CheckHealth
from workflows.job import ProvisionJob
from workflows.liveness import WatchWorkers
from workflows.offers import PlanOffers
from workflows.reconcile import Reconcile

WORKFLOWS = [ProvisionJob, PlanOffers, Reconcile, CheckHealth, WatchWorkers]


async def connect(
    settings: TemporalSettings,
    runtime: TemporalRuntime | None = None,
    codec: CodecSettings | None = None,
) -> Client:
    """A client for the cluster (gpuprov/connection.py: TLS, API key, checked settings); a
    worker built on it reports metrics through `runtime`.

    Pass `settings.codec`: with keys configured, payloads are encrypted (gpuprov/codec.py), and
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


def build_worker(
    client: Client,
    task_queue: str,
    providers: dict[str, CloudProvider],
    records: Records,
    *,
    api_url: str,
    jobs: JobsSettings | None = None,
    skipped: dict[str, str] | None = None,
    ssh_key_dir: Path | None = None,
    ssh_bootstrap: set[str] | None = None,
    sandboxed: bool = True,
    workflows: Sequence[type] = tuple(WORKFLOWS),
    **worker_options: Any,
) -> Worker:
    """The gpuprov worker; `worker_options` go to temporalio's Worker unchanged (the benchmark
    raises max_concurrent_activities and max_cached_workflows for 1000 concurrent jobs).

    With `ssh_key_dir` (the worker's SSH key directory, activities/ssh_keys.py) the worker also
    runs the SSH bootstrap, for the providers in `ssh_bootstrap`.

    `sandboxed` runs workflow code in temporalio's sandbox: the default here, so every test's
    worker has the runtime guard; `running_worker` passes `[temporal] workflow_sandbox`.
    `workflows` replaces the workflow classes (a test runs changed workflow code with it)."""
    jobs = jobs or JobsSettings()
    token_ttl = timedelta(seconds=jobs.join_token_ttl_seconds)
    enrolment = Enrolment(records, api_url, token_ttl)
    store = StoreActivities(records, timedelta(seconds=jobs.block_ttl_seconds))
    if ssh_bootstrap and ssh_key_dir is None:
        raise ValueError("ssh_bootstrap needs ssh_key_dir (where the worker keeps its SSH keys)")
    keys = KeyStore(ssh_key_dir) if ssh_key_dir is not None else None
    over_ssh = (
        [
            *BootstrapActivities(
                providers, keys, RecordsJoinTokens(records, token_ttl), api_url
            ).all(),
            *K3sActivities(providers, keys, jobs.k3s).all(),
        ]
        if keys is not None
        else []
    )
    cloud = CloudActivities(
        providers, enrolment, skipped, ssh_bootstrap=set(ssh_bootstrap or ()), keys=keys
    )
    if not sandboxed:
        worker_options.setdefault("workflow_runner", UnsandboxedWorkflowRunner())
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(workflows),
        activities=[
            *cloud.all(),
            *over_ssh,
            *store.all(),
            *JobContextActivities(cloud, store).all(),
            *RegistrationActivities(records, api_url).all(),
            # The reconciler asks Temporal (through this worker's client) which jobs are live.
            *ReconcileActivities(providers, records, client).all(),
            # The liveness sweep signals jobs through this worker's client too.
            *LivenessActivities(records, client).all(),
            *HealthActivities(providers, records, keys).all(),
        ],
        **worker_options,
    )


def open_records(url: str) -> Records:
    """Connect to the database and bring its schema to the latest migration."""
    database = Database(url)
    database.upgrade()
    return Records(database)


@dataclass
class Runtime:
    worker: Worker
    records: Records
    providers: dict[str, CloudProvider]
    skipped: dict[str, str]


@asynccontextmanager
async def running_worker(client: Client, settings: Settings) -> AsyncIterator[Runtime]:
    """Build the providers and the records from `settings`, run a worker until the block exits."""
    records = open_records(settings.database_url)
    built = build_all(settings.providers)
    providers = built.providers
    worker = build_worker(
        client,
        settings.temporal.task_queue,
        providers,
        records,
        api_url=settings.api.url,
        jobs=settings.jobs,
        skipped=built.skipped,
        ssh_key_dir=Path(settings.temporal.data_dir) / "ssh",
        max_concurrent_activities=settings.temporal.max_concurrent_activities,
        max_cached_workflows=settings.temporal.max_cached_workflows,
        sandboxed=settings.temporal.workflow_sandbox,
        ssh_bootstrap={
            provider_id
            for provider_id in providers
            if (section := settings.providers.section(provider_id)) is not None
            and section.ssh_bootstrap
        },
    )
    try:
        async with worker:
            yield Runtime(
                worker=worker, records=records, providers=providers, skipped=built.skipped
            )
    finally:
        for provider in providers.values():
            await provider.aclose()
        records.db.dispose()
