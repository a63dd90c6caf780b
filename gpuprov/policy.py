"""The failover policy: what the core does when a step fails. One table, one pure function.

Adapters classify a cloud's answer into an ErrorKind (and may name a block scope); `decide` turns
a failure into a Decision, and nothing else in the workflows chooses between retrying, tearing
down, blocking and aborting:

| kind           | retried at the source | tears down | blocks | aborts the job |
| -------------- | --------------------- | ---------- | ------ | -------------- |
| Transient      | yes (backoff)         | -          | -      | -              |
| Capacity       | no                    | yes        | offer  | no             |
| Quota          | no                    | yes        | region | no             |
| Unavailable    | no                    | no         | offer  | no             |
| Failed         | no                    | yes        | offer  | no             |
| InvalidRequest | no                    | no         | -      | yes            |
| Credentials    | no                    | yes        | -      | yes            |

Where the failure happened (its Stage) and whether instances may exist adjust a row:
- a Transient failure that reaches the workflow has spent its retries: it is Failed;
- an attempt tears down whenever instances may exist, whatever the kind (a create's answer can
  be lost while the machine lands);
- an adapter (or the core's own check) may override the block scope, down to NONE;
- a plan failure has no offer to blame: it blocks the provider (or nothing, if overridden so);
- a teardown step that failed gets another round unless its kind aborts;
- a bookkeeping step (the database) that failed for good fails the job, which then releases
  what it holds.
A timeout is a kind too (`TIMEOUT_KIND`, `TIMEOUT_SCOPE`): resources may exist, so Failed, but a
timeout is this worker's (overloaded, killed) or the network's, so it blocks nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from temporalio.common import RetryPolicy

from providers.errors import BlockScope, ErrorKind


class Stage(StrEnum):
    """Where a failing step sits in a job's life, as far as the policy cares."""

    PLAN = "plan"  # asking a provider for offers: no offer to blame
    ATTEMPT = "attempt"  # bringing one offer's nodes up (prepare ... registration)
    TEARDOWN = "teardown"  # deleting, confirming gone, cleaning up
    BOOKKEEPING = "bookkeeping"  # the job's records in the database


@dataclass(frozen=True)
class Row:
    retry: bool  # Temporal retries the step itself with backoff (only Transient)
    teardown: bool  # resources may exist: unwind the attempt
    block: BlockScope  # what not to try again
    abort: bool  # stop the whole job instead of failing over


TABLE: dict[ErrorKind, Row] = {
    ErrorKind.TRANSIENT: Row(retry=True, teardown=False, block=BlockScope.NONE, abort=False),
    ErrorKind.CAPACITY: Row(retry=False, teardown=True, block=BlockScope.OFFER, abort=False),
    ErrorKind.QUOTA: Row(retry=False, teardown=True, block=BlockScope.REGION, abort=False),
    ErrorKind.UNAVAILABLE: Row(retry=False, teardown=False, block=BlockScope.OFFER, abort=False),
    ErrorKind.FAILED: Row(retry=False, teardown=True, block=BlockScope.OFFER, abort=False),
    ErrorKind.INVALID_REQUEST: Row(retry=False, teardown=False, block=BlockScope.NONE, abort=True),
    ErrorKind.CREDENTIALS: Row(retry=False, teardown=True, block=BlockScope.NONE, abort=True),
}

TIMEOUT_KIND = ErrorKind.FAILED
TIMEOUT_SCOPE = BlockScope.NONE

# A teardown step that failed for good is tried again this many rounds in all (pausing
# TEARDOWN_PAUSE x round between them) unless its kind aborts; then it is a possible orphan.
TEARDOWN_ROUNDS = 3
TEARDOWN_PAUSE = timedelta(seconds=2)


@dataclass(frozen=True)
class Failure:
    """A step that failed for good (its own retries spent), as the policy sees it."""

    kind: ErrorKind
    stage: Stage
    # a step that can leave instances or their side resources (prepare, create) has started
    instances_may_exist: bool = False
    scope: BlockScope | None = None  # the adapter's override of the row's block
    rounds_done: int = 1  # teardown: rounds run so far, this one included


@dataclass(frozen=True)
class Decision:
    retry: bool  # run the step again (another teardown round)
    teardown: bool  # unwind the attempt's compensations
    block: BlockScope  # what not to try again (NONE: nothing)
    abort: bool  # stop the job instead of failing over


def retried_at_source(kind: ErrorKind) -> bool:
    """Whether an activity raising `kind` lets Temporal retry it (ApplicationError's
    non_retryable is the negation)."""
    return TABLE[kind].retry


def decide(failure: Failure) -> Decision:
    """What the workflow does with a step that failed for good."""
    row = TABLE[failure.kind]
    if row.retry:  # retries spent; resources may exist by now
        row = TABLE[ErrorKind.FAILED]
    if failure.stage is Stage.TEARDOWN:
        again = not row.abort and failure.rounds_done < TEARDOWN_ROUNDS
        return Decision(retry=again, teardown=False, block=BlockScope.NONE, abort=False)
    if failure.stage is Stage.BOOKKEEPING:
        return Decision(retry=False, teardown=True, block=BlockScope.NONE, abort=True)
    block = failure.scope if failure.scope is not None else row.block
    if failure.stage is Stage.PLAN:  # no offer to blame: the provider, unless nothing is
        block = BlockScope.NONE if row.abort or block is BlockScope.NONE else BlockScope.PROVIDER
    teardown = failure.stage is Stage.ATTEMPT and (row.teardown or failure.instances_may_exist)
    return Decision(retry=False, teardown=teardown, block=block, abort=row.abort)


# Forward steps: Transient errors retry with backoff; every other kind is non_retryable at the
# source (activities/errors.py), so these numbers only ever apply to Transient failures and to
# unclassified exceptions (bugs), which after retries count as Failed.
FORWARD_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
# Heartbeating waits (for running, for registration, for a node's health, the bootstrap):
# a heartbeat timeout is an attempt too, and an overloaded worker's late beats must not spend a
# wait's attempts before its own deadline, which travels in the heartbeat details and bounds
# every retry.
WAIT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=12,
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
