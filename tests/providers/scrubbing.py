"""What every adapter's redaction tests share: error texts that echo a secret whole and across
the lengths where messages used to be cut, a check for any piece of a secret, and one activity
run through Temporal's ActivityEnvironment (the same path a worker takes, no server)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.cloud import CloudActivities, PlanInput
from providers.base import CloudProvider, ResourceRequest
from providers.errors import MAX_MESSAGE_CHARS, MIN_SECRET_CHARS, ErrorKind

KINDS = {kind.value for kind in ErrorKind}


def echoes(secret: str) -> dict[str, str]:
    """Error texts that carry `secret`: once, and repeated past every length an adapter or the
    core ever cut a message at (300 to 2,000 characters), from two offsets half a secret apart,
    so that every such cut falls inside one of its copies."""
    half = " " * (len(secret) // 2)
    repeated = " ".join([secret] * (2 * MAX_MESSAGE_CHARS // len(secret) + 2))
    return {
        "whole": f"invalid key {secret} for this account",
        "straddling": f"rejected: {repeated}",
        "straddling, shifted": f"rejected:{half}{repeated}",
    }


def pieces_of(secret: str, text: str) -> list[str]:
    """Every piece of `secret` (of the shortest length that counts as one) found in `text`."""
    size = MIN_SECRET_CHARS
    return sorted({secret[i : i + size] for i in range(len(secret) - size + 1)} & _grams(text))


def _grams(text: str) -> set[str]:
    size = MIN_SECRET_CHARS
    return {text[i : i + size] for i in range(len(text) - size + 1)}


async def activity_failure(call: Callable[..., Awaitable[Any]], *args: Any) -> ApplicationError:
    """The ApplicationError one activity raised, run as a worker runs it."""
    try:
        await ActivityEnvironment().run(call, *args)
    except ApplicationError as failure:
        return failure
    raise AssertionError(f"{call.__name__} did not fail")


async def plan_failure(provider: CloudProvider, request: ResourceRequest) -> ApplicationError:
    """The failure `gpuprov offers` (PlanOffers) reports for this provider: the plan
    activity's."""
    activities = CloudActivities({provider.name: provider})
    return await activity_failure(
        activities.plan, PlanInput(provider=provider.name, request=request)
    )


def assert_scrubbed(failure: ApplicationError, *secrets: str) -> None:
    """Classified, shortened, and no piece of any secret anywhere in what history keeps."""
    assert failure.type in KINDS, failure.type
    assert len(failure.message) <= MAX_MESSAGE_CHARS
    assert failure.__cause__ is None  # Temporal would record a cause's own text
    for secret in secrets:
        assert pieces_of(secret, failure.message) == [], failure.message
        assert pieces_of(secret, str(failure.details)) == []
