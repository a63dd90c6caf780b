"""Lambda saying our API key back, in part or whole, in a failure or in a successful answer:
a 401 that quotes the key's first 20 characters, an instance type whose GPU description
carries the whole key. No piece of it (8 characters or more) reaches the plan activity's
result or failure, `gpuprov offers`' output, a job's status or its Temporal history."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from activities.cloud import CloudActivities, PlanInput
from gpuprov.models import JobState
from providers.base import ResourceRequest
from providers.errors import REDACTED
from tests.helpers import decoded_history, job, until
from tests.nodes import agent_stack
from tests.providers.scrubbing import assert_scrubbed, pieces_of, plan_failure

from .fake_lambda import FakeLambda
from .fixtures import API_KEY, INVALID_API_KEY, error

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

PREFIX = API_KEY[:20]  # what the vendor quotes of the key it refused
H100 = "gpu_8x_h100_sxm5"
GPUPROV = str(Path(sys.executable).parent / "gpuprov")


def refusing(account: FakeLambda) -> None:
    """/instance-types answers 401 quoting the start of the key."""
    words = f"API key {PREFIX}... was invalid, expired, or deleted."
    body = INVALID_API_KEY | {"error": INVALID_API_KEY["error"] | {"message": words}}
    account.router.get("/instance-types").mock(return_value=httpx.Response(401, json=body))


def describing_the_key(account: FakeLambda) -> None:
    """The H100 type's GPU description carries the whole key (a successful answer)."""
    kind = account.instance_types[H100]["instance_type"]
    kind["gpu_description"] = f"H100 (80 GB SXM5 {API_KEY})"


async def test_a_401_quoting_the_keys_first_20_characters_never_reaches_the_plan_failure():
    account = FakeLambda()
    refusing(account)
    cloud = account.cloud()
    try:
        failure = await plan_failure(cloud, ResourceRequest())
    finally:
        await cloud.aclose()
    assert failure.type == "Credentials" and "global/invalid-api-key" in failure.message
    assert_scrubbed(failure, API_KEY)
    assert PREFIX[:8] not in failure.message


async def test_a_key_in_an_instance_types_description_never_reaches_the_plan_result():
    account = FakeLambda()
    describing_the_key(account)
    cloud = account.cloud()
    activities = CloudActivities({"lambda": cloud})
    try:
        result = await ActivityEnvironment().run(
            activities.plan, PlanInput(provider="lambda", request=ResourceRequest(gpu="H100"))
        )
    finally:
        await cloud.aclose()
    offered = {offer.instance_type: offer for offer in result.offers}
    assert offered[H100].gpu_name == f"H100 SXM5 {REDACTED}"  # still offered, key gone
    assert pieces_of(API_KEY, result.model_dump_json()) == []


async def gpuprov(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        GPUPROV, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def test_an_echoed_key_reaches_neither_offers_nor_a_jobs_status_nor_its_history(
    client, task_queue, job_name, tmp_path
):
    account = FakeLambda()
    describing_the_key(account)
    refused = error("global/invalid-api-key", f"API key {PREFIX}... was invalid.")
    for region in ("us-east-3", "us-south-2"):
        account.launch_answers[(region, H100)] = (401, refused)
    cloud = account.cloud(ssh_key_name="ops-team", poll_interval=0.05)
    address = client.service_client.config.target_host
    env = {"GPUPROV_TEMPORAL__TASK_QUEUE": task_queue, "GPUPROV_TEMPORAL__ADDRESS": address}
    try:
        async with agent_stack(client, task_queue, {"lambda": cloud}, tmp_path) as stack:
            code, offers, err = await gpuprov("offers", "--gpu", "H100", "--gpus-per-node", "8",
                                              env=env)  # fmt: skip
            assert code == 0, err
            handle = await stack.gpuprov.submit(job(job_name))
            final = await until(handle, lambda status: status.state.terminal)
            code, shown, err = await gpuprov("status", job_name, "--json", env=env)
            assert code == 0, err
            history = await client.get_workflow_handle(f"job-{job_name}").fetch_history()
    finally:
        await cloud.aclose()

    assert "lambda/us-east-3/gpu_8x_h100_sxm5" in offers and REDACTED in offers
    assert final.state is JobState.FAILED and final.attempts[0].kind == "Credentials"
    assert json.loads(shown)["attempts"][0]["offer"]["gpu_name"] == f"H100 SXM5 {REDACTED}"
    for text in (offers, err, shown, decoded_history(history)):
        assert pieces_of(API_KEY, text) == [], text[:2000]
