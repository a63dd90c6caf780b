"""User data past EC2's 16 KB, even gzip-compressed: not viable on EC2, so the job fails over to
a cloud that takes more, instead of aborting (EC2 documents the limit: RunInstances
`UserData`, "User data is limited to 16 KB")."""

from __future__ import annotations

import base64
import random

import pytest

from providers.base import InstanceSpec, ResourceRequest
from providers.errors import BlockScope, ErrorKind, ProviderError
from tests.providers.aws.stack import aws_cloud

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

H100X8 = ResourceRequest(gpu="H100", gpus_per_node=8)


def incompressible_script(size: int) -> str:
    """A shell script of `size` random base64 characters: gzip cannot bring it under 16 KB."""
    noise = base64.b64encode(random.Random(7).randbytes(size * 3 // 4)).decode()
    return f"#!/bin/sh\n: {noise}\n"


async def test_user_data_over_16_kb_is_unavailable_for_the_provider_and_nothing_is_launched(front):
    node = InstanceSpec(
        vm="big-a1-n0-c0ffee",
        job="big",
        node_index=0,
        attempt=1,
        user_data=incompressible_script(24_000),
    )
    adapter = aws_cloud(front.url)
    try:
        offer = (await adapter.plan(H100X8))[0]
        prepared = await adapter.prepare(offer, node)
        with pytest.raises(ProviderError) as caught:
            await adapter.create(offer, prepared, node)
    finally:
        await adapter.aclose()
    assert (caught.value.kind, caught.value.block_scope) == (
        ErrorKind.UNAVAILABLE,
        BlockScope.PROVIDER,
    )
    assert "EC2 accepts at most 16384" in caught.value.message
    assert front.requests("RunInstances") == []
