"""What every adapter's test of an ask it cannot honour shares: one worker with that adapter on
the real dev server and a real database, `gpuprov offers` (PlanOffers) for the asking request,
and a whole job that asks it. Both must carry the refusal's reason (`unsupported_reasons`),
and the job must fail having created nothing."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from temporalio.client import Client

from gpuprov.contract import OffersResult
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.models import JobSpec, JobState, JobStatus
from gpuprov.sdk.client import GpuprovClient, OffersQuery
from providers.base import CloudProvider


@dataclass
class Refusal:
    offers: OffersResult  # what `gpuprov offers` shows for the job's request
    status: JobStatus  # the job's final status


async def refused(
    client: Client, task_queue: str, provider: CloudProvider, spec: JobSpec
) -> Refusal:
    """PlanOffers for `spec`'s request, then `spec` run to its end, on one worker holding only
    `provider`."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-test-") as data_dir:
        records = open_records(f"sqlite:///{data_dir}/gpuprov.db")
        worker = build_worker(
            client, task_queue, {provider.name: provider}, records, api_url="http://127.0.0.1:9"
        )
        try:
            async with worker:
                gpuprov = GpuprovClient(client, task_queue)
                offers = await gpuprov.offers(OffersQuery(request=spec.resource_request()))
                status = await (await gpuprov.submit(spec)).result()
        finally:
            records.db.dispose()
    return Refusal(offers=offers, status=status)


def assert_refused(refusal: Refusal, provider: str, reason: str) -> None:
    """`provider`'s offers refused for `reason` in both places, and nothing tried."""
    line = f"{provider}/*: {reason}"
    assert refusal.offers.offers == [] and refusal.offers.errors == []
    assert refusal.offers.rejected == [line]
    assert refusal.status.state is JobState.FAILED
    assert refusal.status.attempts == []
    assert line in refusal.status.rejected_offers
