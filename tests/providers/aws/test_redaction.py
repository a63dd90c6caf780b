"""EC2 echoing the secret key or session token the adapter signs with: neither reaches the
failure of the plan activity (behind `gpuprov offers`), whole or in part, however long the
cloud's words are. The endpoint is the loopback front with EC2's recorded error body."""

from __future__ import annotations

import pytest

from providers.aws.client import StaticCredentials
from providers.aws.cloud import AwsCloud
from providers.base import ResourceRequest
from tests.providers.aws.stack import AwsFront, aws_config, error_reply
from tests.providers.scrubbing import assert_scrubbed, echoes, plan_failure

SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYTESTKEY0"
SESSION_TOKEN = "FwoGZXIvYXdzEXAMPLE-session-token-0123456789"
KEYS = StaticCredentials("AKIATESTACCESSKEY", SECRET_KEY, SESSION_TOKEN)
PLAN_CALLS = ("DescribeInstanceTypes", "DescribeInstanceTypeOfferings")


@pytest.mark.parametrize("words", echoes(SECRET_KEY).values(), ids=list(echoes(SECRET_KEY)))
async def test_signing_secrets_echoed_at_plan_never_reach_the_offers_failure(
    bare_front: AwsFront, words: str
):
    for action in PLAN_CALLS:
        message = f"{words} / {SESSION_TOKEN}"
        bare_front.answer(
            action, error_reply(401, "error.xml", code="AuthFailure", message=message)
        )
    cloud = AwsCloud(aws_config(bare_front.url), credentials=KEYS)
    try:
        failure = await plan_failure(cloud, ResourceRequest(gpu="H100", gpus_per_node=8))
    finally:
        await cloud.aclose()
    assert failure.type == "Credentials" and "AuthFailure" in failure.message
    assert_scrubbed(failure, SECRET_KEY, SESSION_TOKEN)


def test_the_adapter_names_its_secret_key_and_session_token_not_the_key_id() -> None:
    cloud = AwsCloud(aws_config("http://127.0.0.1:9"), credentials=KEYS)
    assert sorted(cloud.secrets()) == sorted([SECRET_KEY, SESSION_TOKEN])
