"""Fixtures for the AWS adapter's tests: one moto server per test module, a fresh front per
test (moto emptied first). The helpers themselves live in stack.py, importable from anywhere."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.providers.aws.stack import REGION, AwsFront, moto_server, reset_moto

P5_PRICE = 55.04  # a test price served by the front's Price List, not AWS's


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def front(moto_url: str) -> Iterator[AwsFront]:
    """The loopback endpoint the adapter talks to: recorded answers, prices, then moto."""
    reset_moto(moto_url)
    with AwsFront(moto_url, prices={(REGION, "p5.48xlarge"): P5_PRICE}) as endpoint:
        yield endpoint


@pytest.fixture
def bare_front() -> Iterator[AwsFront]:
    """Recorded answers only (no moto behind it): for error paths and hostile bodies."""
    with AwsFront() as endpoint:
        yield endpoint
