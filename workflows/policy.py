"""The failover policy: what the core does with each ErrorKind. The ONE table.

Adapters classify; this module decides. `workflows/job.py` reads `action_for(kind)` and nothing
else to choose between retrying, tearing down, blocking and aborting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio.common import RetryPolicy

from gpuprov.models import BlockScope
from providers.errors import ErrorKind


@dataclass(frozen=True)
class Action:
    retry_step: bool  # Temporal retries the step itself (only Transient)
    teardown: bool  # resources may exist: terminate the attempt's instances
    block: BlockScope | None  # what not to try again
    abort: bool  # stop the whole job instead of failing over


POLICY: dict[ErrorKind, Action] = {
    ErrorKind.TRANSIENT: Action(retry_step=True, teardown=False, block=None, abort=False),
    ErrorKind.CAPACITY: Action(
        retry_step=False, teardown=True, block=BlockScope.OFFER, abort=False
    ),
    ErrorKind.QUOTA: Action(retry_step=False, teardown=True, block=BlockScope.REGION, abort=False),
    ErrorKind.UNAVAILABLE: Action(
        retry_step=False, teardown=False, block=BlockScope.OFFER, abort=False
    ),
    ErrorKind.FAILED: Action(retry_step=False, teardown=True, block=BlockScope.OFFER, abort=False),
    ErrorKind.INVALID_REQUEST: Action(retry_step=False, teardown=False, block=None, abort=True),
    ErrorKind.CREDENTIALS: Action(retry_step=False, teardown=True, block=None, abort=True),
}


# plan has no offer to blame: a plan failure that does not abort blocks the whole provider.
PLAN_FAILURE_SCOPE = BlockScope.PROVIDER


def action_for(kind: ErrorKind) -> Action:
    """The action for a step that failed for good with `kind`.

    A Transient error reaching the workflow means Temporal's retries ran out; resources may exist
    by then, so it is treated as Failed.
    """
    if POLICY[kind].retry_step:
        return POLICY[ErrorKind.FAILED]
    return POLICY[kind]


# A teardown step that failed for good is tried again this many rounds in all (pausing
# TEARDOWN_PAUSE x round between them) unless its kind aborts; then it is a possible orphan.
TEARDOWN_ROUNDS = 3
TEARDOWN_PAUSE = timedelta(seconds=2)


def retry_teardown(kind: ErrorKind, rounds_done: int) -> bool:
    """Whether a failed teardown step deserves another round."""
    return not action_for(kind).abort and rounds_done < TEARDOWN_ROUNDS


# Forward steps: Transient errors retry with backoff; every other kind is non_retryable at the
# source (activities/errors.py), so these numbers only ever apply to Transient failures and to
# unclassified exceptions (bugs), which after retries count as Failed.
FORWARD_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
# Database steps ride out a short outage (about 5 minutes) before the job gives up.
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=14,
)
# Teardown steps try harder: giving up means a possible orphan for the reconciler.
TEARDOWN_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=12,
)
