"""Per-test Lambda account (FakeLambda) and an adapter pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from .fake_lambda import FakeLambda


@pytest.fixture
def account() -> FakeLambda:
    return FakeLambda()


@pytest.fixture
async def cloud(account: FakeLambda) -> AsyncIterator[Any]:
    adapter = account.cloud(ssh_key_name="ops-team")
    yield adapter
    await adapter.aclose()
