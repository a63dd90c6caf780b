"""The fault matrix: each ErrorKind injected at each primitive -> outcome, blocks, no leftovers.

Faults hit offer A (or attempt 1's VMs); the policy decides whether the job stays on A (Transient
retried), fails over to B (offer blocked), skips to C (region blocked), or aborts. `list` is the
shared region-wide observe that the waits use (activities/observe_hub.py); `observe` is the
per-VM call, which the delete step makes first during release. Teardown faults fire once during
release: the job still ends clean unless the kind aborts teardown, in which case the leak is
recorded (the reconciler's job)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from gpuprov.config import FaultRule
from gpuprov.engine import open_records
from gpuprov.models import BlockScope, JobState
from providers.errors import ErrorKind
from tests.helpers import (
    OFFER_A,
    OFFER_B,
    OFFER_C,
    assert_nothing_left,
    assert_one_create_per_vm,
    fake_worker,
    fast_cloud,
    job,
    node_of,
    ready_then_release,
)

K = ErrorKind


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Expect:
    state: JobState
    winner: str | None  # offer the job ran on
    blocks: tuple[tuple[BlockScope, str, ErrorKind], ...] = ()
    leaks: bool = False


# Forward steps on offer A: what the ErrorKind table says must happen.
FORWARD = {
    K.TRANSIENT: Expect(JobState.COMPLETED, OFFER_A),
    K.CAPACITY: Expect(JobState.COMPLETED, OFFER_B, ((BlockScope.OFFER, OFFER_A, K.CAPACITY),)),
    K.QUOTA: Expect(JobState.COMPLETED, OFFER_C, ((BlockScope.REGION, "fake/r1", K.QUOTA),)),
    K.UNAVAILABLE: Expect(
        JobState.COMPLETED, OFFER_B, ((BlockScope.OFFER, OFFER_A, K.UNAVAILABLE),)
    ),
    K.FAILED: Expect(JobState.COMPLETED, OFFER_B, ((BlockScope.OFFER, OFFER_A, K.FAILED),)),
    K.INVALID_REQUEST: Expect(JobState.FAILED, None),
    K.CREDENTIALS: Expect(JobState.FAILED, None),
}
# plan is provider-wide: anything but Transient blocks (or aborts) the only provider.
PLAN = {
    K.TRANSIENT: Expect(JobState.COMPLETED, OFFER_A),
    **{
        kind: Expect(JobState.FAILED, None, ((BlockScope.PROVIDER, "fake", kind),))
        for kind in (K.CAPACITY, K.QUOTA, K.UNAVAILABLE, K.FAILED)
    },
    K.INVALID_REQUEST: Expect(JobState.FAILED, None),
    K.CREDENTIALS: Expect(JobState.FAILED, None),
}
# Teardown steps during release: retried per policy, except kinds that abort.
TEARDOWN = {
    kind: Expect(JobState.COMPLETED, OFFER_A, leaks=kind in (K.INVALID_REQUEST, K.CREDENTIALS))
    for kind in K
}


def _fault(primitive: str, kind: ErrorKind, name: str) -> FaultRule:
    message = f"injected {kind.value} at {primitive}"
    if primitive == "plan":
        # Transient once (retried); every other kind on every call.
        return FaultRule(
            primitive="plan", kind=kind, message=message, times=1 if kind is K.TRANSIENT else None
        )
    if primitive in ("prepare", "create"):
        times = 1 if kind is K.TRANSIENT else None
        return FaultRule(
            primitive=primitive, kind=kind, message=message, offer=OFFER_A, times=times
        )
    if primitive == "list":
        # region-wide: the first poll of the wait for running, in offer A's region
        return FaultRule(primitive="list", kind=kind, message=message, region="r1", times=1)
    # observe / delete / cleanup take a VM, not an offer: target attempt 1, first call only.
    return FaultRule(primitive=primitive, kind=kind, message=message, vm=f"{name}-a1-", times=1)


def _expected(primitive: str, kind: ErrorKind) -> Expect:
    if primitive == "plan":
        return PLAN[kind]
    if primitive in ("observe", "delete", "cleanup"):
        return TEARDOWN[kind]
    if primitive == "list" and kind is K.TRANSIENT:
        return Expect(JobState.COMPLETED, OFFER_A)  # a missed poll inside the wait
    return FORWARD[kind]


CELLS = [
    (primitive, kind)
    for primitive in ("plan", "prepare", "create", "list", "observe", "delete", "cleanup")
    for kind in ErrorKind
]


@pytest.mark.parametrize(("primitive", "kind"), CELLS, ids=[f"{p}-{k.value}" for p, k in CELLS])
async def test_fault_matrix(
    client, task_queue, job_name, tmp_path, primitive: str, kind: ErrorKind
):
    expect = _expected(primitive, kind)
    config = fast_cloud([_fault(primitive, kind, job_name)])
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    async with fake_worker(client, task_queue, config, records) as (gpuprov, cloud):
        handle = await gpuprov.submit(job(job_name))
        _, final = await ready_then_release(handle)

        assert final.state is expect.state, final.error
        winners = [a.offer.id for a in final.attempts if a.outcome.value == "succeeded"]
        assert winners == ([expect.winner] if expect.winner else [])
        blocks = tuple((b.scope, b.key, b.kind) for b in final.blocks)
        assert blocks == expect.blocks
        assert bool(final.leaks) is expect.leaks
        assert_one_create_per_vm(cloud)
        if expect.leaks:
            # Teardown gave up on an aborting kind: the status names the possible orphan,
            # and the database records it for the reconciler.
            assert kind.value in final.leaks[0]
            if primitive in ("observe", "delete"):
                orphans = records.open_orphans()
                assert [node_of(o.vm) for o in orphans] == [f"{job_name}-a1-n0"]
                assert kind.value in orphans[0].last_error
        else:
            assert_nothing_left(cloud)
            assert records.open_orphans() == []
        blocks_in_db = {(b.scope, b.key, b.kind) for b in records.active_blocks(_now())}
        assert blocks_in_db == {(s.value, k, kd.value) for s, k, kd in expect.blocks}
        if expect.state is JobState.FAILED:
            assert f"injected {kind.value} at {primitive}" in (final.error or "")
        failed = [a for a in final.attempts if a.kind is not None]
        for attempt in failed:
            assert attempt.kind is kind or (kind is K.TRANSIENT and attempt.kind is K.TRANSIENT)
            assert f"injected {kind.value}" in (attempt.message or "")
