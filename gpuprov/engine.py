"""Wiring shared by worker.py, `gpuprov dev`, the demo and the tests: client and Worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.cloud import CloudActivities
from gpuprov.config import Settings, TemporalSettings
from providers import build
from providers.base import CloudProvider
from workflows.job import ProvisionJob
from workflows.offers import PlanOffers

WORKFLOWS = [ProvisionJob, PlanOffers]


async def connect(settings: TemporalSettings) -> Client:
    return await Client.connect(
        settings.address,
        namespace=settings.namespace,
        data_converter=pydantic_data_converter,
    )


def build_worker(client: Client, task_queue: str, providers: dict[str, CloudProvider]) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=CloudActivities(providers).all(),
    )


@asynccontextmanager
async def running_worker(client: Client, settings: Settings) -> AsyncIterator[Worker]:
    """Build the providers from `settings`, run a worker until the block exits, close them."""
    providers = build(settings.providers)
    worker = build_worker(client, settings.temporal.task_queue, providers)
    try:
        async with worker:
            yield worker
    finally:
        for provider in providers.values():
            await provider.aclose()
