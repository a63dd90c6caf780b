"""Fixtures of the RunPod adapter tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.providers.runpod.fake_api import FakeRunPod


@pytest.fixture
async def api() -> AsyncIterator[FakeRunPod]:
    """A fresh stand-in for RunPod's REST v2, per test."""
    yield FakeRunPod()
