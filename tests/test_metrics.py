"""The worker's Prometheus endpoint: Temporal SDK metrics and gpuprov_* metrics on one /metrics,
scraped over HTTP from a worker whose client has a metrics runtime (as worker.py builds it)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from gpuprov import metrics
from gpuprov.cli.dev import free_port
from gpuprov.config import ConfigError, FaultRule, MetricsSettings
from gpuprov.engine.worker import metrics_runtime
from gpuprov.models import JobState
from providers.errors import ErrorKind
from tests.helpers import OFFER_A, fake_worker, fast_cloud, job, ready_then_release

Labels = dict[str, str]
Sample = tuple[str, Labels, float]
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Endpoint:
    url: str
    client: Client  # connected to the session's dev server with the metrics runtime


@pytest.fixture(scope="module")
async def endpoint(temporal_env: WorkflowEnvironment) -> AsyncIterator[Endpoint]:
    """One metrics runtime for the module: a runtime binds its port once."""
    client = temporal_env.client
    port = free_port()
    runtime = metrics_runtime(MetricsSettings(bind=f"127.0.0.1:{port}"))
    metered = await Client.connect(
        client.service_client.config.target_host,
        namespace=client.namespace,
        runtime=runtime,
        data_converter=pydantic_data_converter,
    )
    yield Endpoint(url=f"http://127.0.0.1:{port}/metrics", client=metered)


def parse(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            name, labels, value = match.groups()
            samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return samples


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """Sum of `name` over samples whose labels include `labels` (0 when none match)."""
    return sum(v for n, got, v in samples if n == name and labels.items() <= got.items())


async def scrape_until(
    url: str, ready: Callable[[list[Sample]], bool], timeout: float = 15
) -> list[Sample]:
    """Scrape until `ready` holds (the exporter may lag the event by a moment)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while True:
            response = await http.get(url)
            response.raise_for_status()
            samples = parse(response.text)
            if ready(samples) or time.monotonic() >= deadline:
                return samples
            await asyncio.sleep(0.2)


async def test_capacity_failover_shows_in_gpuprov_and_temporal_metrics(
    endpoint, task_queue, job_name
):
    capacity = FaultRule(primitive="create", kind=ErrorKind.CAPACITY, offer=OFFER_A)
    async with fake_worker(endpoint.client, task_queue, fast_cloud([capacity])) as (gpuprov, _):
        handle = await gpuprov.submit(job(job_name))
        at_ready, final = await ready_then_release(handle)
        assert at_ready.state is JobState.READY and final.state is JobState.COMPLETED

        ours = {"task_queue": task_queue}
        samples = await scrape_until(
            endpoint.url,
            lambda s: (
                value(s, "temporal_workflow_completed", **ours) >= 1
                and value(s, metrics.JOB_STATE.name, state="completed", **ours) >= 1
            ),
        )

    # The Temporal SDK's own runtime metrics, on the same endpoint.
    assert value(samples, "temporal_workflow_completed", workflow_type="ProvisionJob", **ours) == 1
    assert value(samples, "temporal_request") > 0
    assert value(samples, "temporal_activity_execution_latency_count", **ours) > 0

    # gpuprov's: every transition once, the two offers, the one Capacity failover, the wait.
    for state in ("queued", "provisioning", "ready", "releasing", "completed"):
        assert value(samples, metrics.JOB_STATE.name, state=state, **ours) == 1, state
    for state in ("failed", "cancelled"):
        assert value(samples, metrics.JOB_STATE.name, state=state, **ours) == 0, state
    assert value(samples, metrics.OFFERS_TRIED.name, provider="fake", region="r1", **ours) == 2
    assert value(samples, metrics.FAILOVERS.name, kind="Capacity", provider="fake", **ours) == 1
    assert value(samples, metrics.FAILOVERS.name, **ours) == 1

    seconds = metrics.PROVISIONING_SECONDS.name
    assert value(samples, f"{seconds}_count", outcome="provisioned", **ours) == 1
    assert 0 < value(samples, f"{seconds}_sum", outcome="provisioned", **ours) < 60
    assert value(samples, f"{seconds}_bucket", outcome="provisioned", le="60", **ours) == 1

    # One whole-job estimate per attempt: 10 USD/hour on each of the two offers.
    spend = metrics.ESTIMATED_SPEND.name
    assert value(samples, f"{spend}_count", provider="fake", currency="USD", **ours) == 2
    assert value(samples, f"{spend}_sum", provider="fake", currency="USD", **ours) == 20.0


async def test_teardown_that_gives_up_counts_an_orphan(endpoint, task_queue, job_name):
    """Credentials on delete aborts the teardown: the VM is recorded as a possible orphan."""
    denied = FaultRule(
        primitive="delete", kind=ErrorKind.CREDENTIALS, vm=f"{job_name}-a1-", times=1
    )
    async with fake_worker(endpoint.client, task_queue, fast_cloud([denied])) as (gpuprov, _):
        _, final = await ready_then_release(await gpuprov.submit(job(job_name)))
        assert final.state is JobState.COMPLETED and final.leaks

        ours = {"task_queue": task_queue}
        samples = await scrape_until(
            endpoint.url, lambda s: value(s, metrics.ORPHANS_FOUND.name, **ours) >= 1
        )

    found = value(
        samples, metrics.ORPHANS_FOUND.name, provider="fake", activity_type="record_orphan", **ours
    )
    assert found == 1
    assert value(samples, metrics.ORPHANS_RESOLVED.name) == 0  # the reconciler did not run


def test_metrics_are_off_by_default_and_a_bad_bind_names_the_setting():
    assert metrics_runtime(MetricsSettings()) is None
    with pytest.raises(ConfigError, match="metrics.bind 'nonsense'"):
        metrics_runtime(MetricsSettings(bind="nonsense"))
