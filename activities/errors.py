"""ProviderError <-> Temporal ApplicationError, in one place.

Activities raise `ApplicationError(type=<ErrorKind>, non_retryable=<not Transient>)` so Temporal's
retry policy performs Transient retries and the workflow's saga handles every other kind. The
workflow unwraps an `ActivityError` back into a `StepFailure` with the kind, the cloud's words and
any block-scope override. Messages are truncated so payloads and histories stay small.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ApplicationErrorCategory,
    TimeoutError,
)

from providers.errors import ErrorKind, ProviderError

MAX_MESSAGE_CHARS = 2000
NO_BLOCK = "none"  # StepFailure.block_scope: fail over, but block nothing
KINDS = {kind.value: kind for kind in ErrorKind}


def truncate(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return message if len(message) <= limit else message[: limit - 15] + "...(truncated)"


def to_application_error(error: ProviderError, step: str | None = None) -> ApplicationError:
    """`step` names the primitive that failed inside an activity that runs several (retire)."""
    details: dict[str, str | None] = {"block_scope": error.block_scope}
    if step is not None:
        details["step"] = step
    return ApplicationError(
        truncate(error.message),
        details,
        type=error.kind.value,
        non_retryable=error.kind is not ErrorKind.TRANSIENT,
        # A classified cloud answer is an expected outcome the saga handles, not a worker
        # fault: log it at debug. Unclassified exceptions still log with their traceback.
        category=ApplicationErrorCategory.BENIGN,
        next_retry_delay=(
            timedelta(seconds=error.retry_after) if error.retry_after is not None else None
        ),
    )


@contextmanager
def classified(step: str | None = None) -> Iterator[None]:
    """Inside an activity: turn a ProviderError into the ApplicationError the workflow reads
    (naming `step`, the primitive, where the activity runs more than one)."""
    try:
        yield
    except ProviderError as error:
        raise to_application_error(error, step) from error


@dataclass
class StepFailure(Exception):
    """A workflow step that failed for good: which step, which kind, the cloud's words."""

    step: str
    kind: ErrorKind
    message: str
    block_scope: str | None = None

    def __str__(self) -> str:
        return f"{self.kind.value} at {self.step}: {self.message}"


def unwrap(step: str, error: ActivityError) -> StepFailure:
    """Read the ErrorKind out of an activity failure; anything unclassified is Failed."""
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.type in KINDS:
        scope = None
        if cause.details and isinstance(cause.details[0], dict):
            scope = cause.details[0].get("block_scope")
            step = cause.details[0].get("step") or step
        kind = KINDS[cause.type]
        message = cause.message
        if kind is ErrorKind.TRANSIENT:
            message = f"retries exhausted: {message}"
        return StepFailure(step, kind, message, scope)
    if isinstance(cause, TimeoutError):
        # Resources may exist (Failed: tear down), but a timeout is this worker's (overloaded,
        # killed) or the network's, not the offer's: blocking the offer for every job would
        # spread one worker's overload (docs/performance.md, 1000 jobs at once).
        return StepFailure(step, ErrorKind.FAILED, f"timed out ({cause.type.name})", NO_BLOCK)
    detail = cause.message if cause is not None else str(error)
    kind_name = getattr(cause, "type", None) or type(cause).__name__
    return StepFailure(step, ErrorKind.FAILED, truncate(f"{kind_name}: {detail}"))
