"""The GCE adapter over respx for each test: `api` (the mock router a test adds routes to) and
`cloud`, a GceCloud whose HTTP goes to it, with a static access token."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import respx

from providers.gce.auth import StaticToken
from providers.gce.cloud import GceCloud
from tests.providers.gce import bodies
from tests.providers.gce.fake_gce import FakeGce


@pytest.fixture
def api() -> respx.MockRouter:
    return respx.MockRouter(assert_all_called=False)


def respx_cloud(api: respx.MockRouter, access_token: str = "tkn") -> GceCloud:
    """A GceCloud whose HTTP goes to `api`, holding `access_token`."""
    config = FakeGce().config(project=bodies.PROJECT, operation_timeout=5)
    http = httpx.AsyncClient(transport=httpx.MockTransport(api.async_handler))
    return GceCloud(config, tokens=StaticToken(access_token), http=http)


@pytest.fixture
async def cloud(api: respx.MockRouter) -> AsyncIterator[GceCloud]:
    built = respx_cloud(api)
    yield built
    await built.aclose()
