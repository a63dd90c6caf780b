"""The fault matrix: each ErrorKind injected at each primitive -> outcome, blocks, no leftovers.

Faults hit offer A (or attempt 1's VMs), and the fake cloud answers its offers shuffled, so
which offer comes next is the workflow's ranking. The policy decides whether the job stays on A
(Transient retried), fails over to B (offer blocked), skips to C (region blocked), or aborts.
`list` is the shared region-wide observe that the waits use (activities/observe_hub.py);
`observe` is the per-VM call, which the delete step makes first during release. Teardown
faults fire once during release: the job still ends clean unless the kind aborts teardown, in
which case the leak is recorded (the reconciler's job).

Every cell also proves its fault happened, from the fake cloud's ledger: the rule fired once, in
the phase it aims at (before ready, or only during release). Where the outcome is the same as
a run without the fault (the fault absorbed by a retry), the cell shows the retry: the faulted
primitive was called twice, once more than in the fault-free control run below. The `list`
cells boot instantly, so without the fault the wait for running makes exactly one list call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from gpuprov.config import FaultRule
from gpuprov.engine.worker import open_records
from gpuprov.models import BlockScope, JobState
from providers.errors import ErrorKind
from providers.fake import FakeCloud
from tests.helpers import (
    OFFER_A,
    OFFER_B,
    OFFER_C,
    SHUFFLED,
    assert_nothing_left,
    assert_one_create_per_vm,
    fake_worker,
    fast_cloud,
    job,
    node_of,
    ready_then_release,
)

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

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


TEARDOWN_PRIMITIVES = ("observe", "delete", "cleanup")
FAULT_FREE = Expect(JobState.COMPLETED, OFFER_A)  # what a run without any fault ends in


def _region_of(primitive: str) -> str:
    """Where the fake cloud counts the faulted calls: plan is provider-wide, the rest hit
    offer A's region."""
    return "*" if primitive == "plan" else "r1"


def _config(primitive: str, faults: list[FaultRule]):
    # An instant boot: a wait for running that misses no poll makes exactly one list call.
    return fast_cloud(faults, boot_delay_seconds=0.0) if primitive == "list" else fast_cloud(faults)


async def test_fault_free_run_calls_each_primitive_once(client, task_queue, job_name, tmp_path):
    """The control the retried cells compare against: one call of each primitive, and one
    list call in the wait for running of an instantly booting machine."""
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    config = _config("list", [])
    async with fake_worker(client, task_queue, config, records, shuffle_offers=SHUFFLED) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name))
        calls_at_ready: dict[tuple[str, str], int] = {}
        _, final = await ready_then_release(
            handle, on_ready=lambda _: calls_at_ready.update(cloud.state.call_counts())
        )
        assert final.state is JobState.COMPLETED, final.error
        assert calls_at_ready[("list", "r1")] == 1
        calls = cloud.state.call_counts()
        for primitive in ("plan", "prepare", "create", "observe", "delete", "cleanup"):
            assert calls[(primitive, _region_of(primitive))] == 1, (primitive, calls)
        assert_nothing_left(cloud)


def _assert_the_fault_happened(
    cloud: FakeCloud,
    rule: FaultRule,
    primitive: str,
    expect: Expect,
    fired_at_ready: list[int],
    calls_at_ready: dict[tuple[str, str], int],
) -> None:
    """The injected fault fired once, in the phase it aims at (teardown faults only during
    release, the others before the job was ready or ended), and left the trace only it
    explains where the outcome alone would not show it."""
    assert cloud.fault_fires() == [(rule, 1)]
    assert fired_at_ready == [0 if primitive in TEARDOWN_PRIMITIVES else 1]
    calls = calls_at_ready if primitive == "list" else cloud.state.call_counts()
    faulted_calls = calls.get((primitive, _region_of(primitive)), 0)
    if expect == FAULT_FREE:
        # Same outcome as without the fault: only a retry explains it (the failed call and
        # the one that went through; the fault-free run makes one).
        assert faulted_calls == 2, calls
    elif expect.leaks:
        assert faulted_calls == 1, calls  # an aborting kind is not retried


@pytest.mark.parametrize(("primitive", "kind"), CELLS, ids=[f"{p}-{k.value}" for p, k in CELLS])
async def test_fault_matrix(
    client, task_queue, job_name, tmp_path, primitive: str, kind: ErrorKind
):
    expect = _expected(primitive, kind)
    rule = _fault(primitive, kind, job_name)
    config = _config(primitive, [rule])
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    async with fake_worker(client, task_queue, config, records, shuffle_offers=SHUFFLED) as (
        gpuprov,
        cloud,
    ):
        handle = await gpuprov.submit(job(job_name))
        fired_at_ready: list[int] = []
        calls_at_ready: dict[tuple[str, str], int] = {}

        def at_ready(_status) -> None:
            fired_at_ready.append(cloud.fired(rule))
            calls_at_ready.update(cloud.state.call_counts())

        _, final = await ready_then_release(handle, on_ready=at_ready)

        assert final.state is expect.state, final.error
        winners = [a.offer.id for a in final.attempts if a.outcome.value == "succeeded"]
        assert winners == ([expect.winner] if expect.winner else [])
        blocks = tuple((b.scope, b.key, b.kind) for b in final.blocks)
        assert blocks == expect.blocks
        assert bool(final.leaks) is expect.leaks
        assert_one_create_per_vm(cloud)
        _assert_the_fault_happened(cloud, rule, primitive, expect, fired_at_ready, calls_at_ready)
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
        # a forward step on offer A that does not retry fails attempt 1 (none: the loop below
        # would check nothing)
        forward_failure = primitive in ("prepare", "create", "list") and kind is not K.TRANSIENT
        assert len(failed) == (1 if forward_failure else 0), final.attempts
        for attempt in failed:
            assert attempt.kind is kind or (kind is K.TRANSIENT and attempt.kind is K.TRANSIENT)
            assert f"injected {kind.value}" in (attempt.message or "")
