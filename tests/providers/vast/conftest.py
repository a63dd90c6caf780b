"""Fixtures for the Vast.ai adapter: a fake Vast API on respx, and an adapter pointed at it
with explicit credentials (nothing is read from the environment or from files)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import respx

from providers.vast.cloud import VastCloud
from providers.vast.config import VastConfig, VastMinIntervals
from tests.providers.vast import fixtures
from tests.providers.vast.fake_api import FakeVastApi

NO_PACING = VastMinIntervals(search=0, create=0, list_page=0, destroy=0)


def vast_config(**overrides: Any) -> VastConfig:
    settings: dict[str, Any] = dict(
        base_url=fixtures.BASE_URL,
        min_intervals=NO_PACING,
        poll_interval=0.05,
        boot_timeout=10,
        delete_timeout=10,
    )
    settings.update(overrides)
    return VastConfig(**settings)


@pytest.fixture
def router() -> Iterator[respx.Router]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as mock:
        yield mock


@pytest.fixture
def vast_api(router: respx.Router) -> Iterator[FakeVastApi]:
    """The fake API; at the end, every request it saw must match Vast's OpenAPI files."""
    api = FakeVastApi()
    api.install(router)
    yield api
    assert api.violations == []


@pytest.fixture
async def cloud() -> AsyncIterator[VastCloud]:
    adapter = VastCloud(vast_config(), api_key=fixtures.API_KEY)
    yield adapter
    await adapter.aclose()
