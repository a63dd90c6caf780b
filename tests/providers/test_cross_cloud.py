"""Failover across clouds: one worker with the GCE adapter (over its fake Compute
Engine) and the AWS adapter (over moto). GCE is cheaper, so the job tries it first; every GCE
zone stocks out through the insert operation, and the job fails over to AWS, reaches ready, is
released, and nothing is left on either cloud. The AWS machine boots its user data, and its
node agent registers through the real API before the job is ready."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuprov.models import AttemptOutcome, JobState
from providers.errors import ErrorKind
from tests.helpers import job, ready_then_release
from tests.nodes import agent_stack, booting_nodes
from tests.providers.aws.stack import (
    REGION,
    AwsFront,
    aws_cloud,
    gpuprov_security_groups,
    live_instances,
    moto_server,
    reset_moto,
)
from tests.providers.aws.test_job import launched_user_data
from tests.providers.gce.fake_gce import ZONES, FakeGce

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

P5_PRICE = 55.04  # a test price served by the front's Price List, not AWS's


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


async def test_every_gce_zone_stocked_out_fails_over_to_aws(
    client, task_queue, job_name, moto_url, tmp_path
):
    # moto keeps its state per process, not per server: start from none of another test's.
    reset_moto(moto_url)
    gce = FakeGce(stockout_zones=set(ZONES))
    with AwsFront(moto_url, prices={(REGION, "p5.48xlarge"): P5_PRICE}) as front:
        providers = {"gce": gce.cloud(), "aws": aws_cloud(front.url)}
        try:
            async with (
                agent_stack(client, task_queue, providers, tmp_path) as stack,
                booting_nodes(lambda: launched_user_data(moto_url), tmp_path) as agents,
            ):
                handle = await stack.gpuprov.submit(job(job_name, max_hourly_cost=100.0))
                at_ready, final = await ready_then_release(handle, timeout=90)
        finally:
            for provider in providers.values():
                await provider.aclose()
        aws_left = live_instances(front.upstream)
        groups_left = gpuprov_security_groups(front.upstream)

    assert at_ready.state is JobState.READY, at_ready.error
    *failed, won = at_ready.attempts
    assert failed, "GCE was not tried first"
    for attempt in failed:
        assert attempt.offer.provider == "gce"
        assert (attempt.kind, attempt.outcome) == (ErrorKind.CAPACITY, AttemptOutcome.FAILED)
        assert "ZONE_RESOURCE_POOL_EXHAUSTED" in (attempt.message or "")
    assert won.offer.provider == "aws" and won.outcome is AttemptOutcome.SUCCEEDED
    [agent] = agents
    assert agent.returncode == 0, agent.stderr
    assert final.state is JobState.COMPLETED
    assert gce.inserts == [] and gce.live_instances() == [] and gce.firewalls == {}
    assert aws_left == [] and groups_left == []
