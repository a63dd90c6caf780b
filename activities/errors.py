"""ProviderError <-> Temporal ApplicationError, in one place.

Activities raise `ApplicationError(type=<ErrorKind>, non_retryable=...)` where the policy says
whether Temporal retries the kind at the source (gpuprov/policy.py: only Transient), so
Temporal's retry policy performs those retries and the workflow's saga handles every other kind.
The workflow unwraps an `ActivityError` back into a `StepFailure` with the kind, the cloud's
words and any block-scope override; a timeout becomes the policy's timeout kind. Messages are
truncated so payloads and histories stay small.
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

from gpuprov import policy
from providers.errors import BlockScope, ErrorKind, ProviderError, truncate

KINDS = {kind.value: kind for kind in ErrorKind}
SCOPES = {scope.value: scope for scope in BlockScope}


def to_application_error(error: ProviderError, step: str | None = None) -> ApplicationError:
    """`step` names the primitive that failed inside an activity that runs several (retire)."""
    details: dict[str, str | None] = {
        "block_scope": error.block_scope.value if error.block_scope is not None else None
    }
    if step is not None:
        details["step"] = step
    return ApplicationError(
        truncate(error.message),
        details,
        type=error.kind.value,
        non_retryable=not policy.retried_at_source(error.kind),
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
    (naming `step`, the primitive, where the activity runs more than one). The original is not
    kept as the cause: Temporal would record its text a second time, uncut. (Cloud calls use
    activities/redaction.py's `scrubbed`, which also removes every secret in play.)"""
    try:
        yield
    except ProviderError as error:
        raise to_application_error(error, step) from None


@dataclass
class StepFailure(Exception):
    """A workflow step that failed for good: which step (and its stage in the job), which
    kind, the cloud's words, and the block scope the adapter asked for (None: the policy's)."""

    step: str
    kind: ErrorKind
    message: str
    scope: BlockScope | None = None
    stage: policy.Stage = policy.Stage.ATTEMPT

    def failure(self, *, instances_may_exist: bool = False) -> policy.Failure:
        """What the policy decides on."""
        return policy.Failure(
            self.kind, self.stage, instances_may_exist=instances_may_exist, scope=self.scope
        )

    def __str__(self) -> str:
        return f"{self.kind.value} at {self.step}: {self.message}"


def unwrap(step: str, stage: policy.Stage, error: ActivityError) -> StepFailure:
    """Read the ErrorKind out of an activity failure; anything unclassified is Failed."""
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.type in KINDS:
        scope = None
        if cause.details and isinstance(cause.details[0], dict):
            scope = SCOPES.get(cause.details[0].get("block_scope") or "")
            step = cause.details[0].get("step") or step
        kind = KINDS[cause.type]
        message = cause.message
        if policy.retried_at_source(kind):
            message = f"retries exhausted: {message}"
        return StepFailure(step, kind, message, scope, stage)
    if isinstance(cause, TimeoutError):
        message = f"timed out ({cause.type.name})"
        return StepFailure(step, policy.TIMEOUT_KIND, message, policy.TIMEOUT_SCOPE, stage)
    detail = cause.message if cause is not None else str(error)
    kind_name = getattr(cause, "type", None) or type(cause).__name__
    return StepFailure(step, ErrorKind.FAILED, truncate(f"{kind_name}: {detail}"), None, stage)
