"""Records on a real database: every test runs on SQLite and on PostgreSQL 15 (conftest)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from gpuprov.store.db import Database, JoinToken, WorkerRecord, utcnow
from gpuprov.store.records import Records, TokenRejected
from tests.rows import snapshot

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]


def race(count: int, action: Callable[[int], T]) -> list[T | BaseException]:
    """Run action(0..count-1) on `count` threads released together; results or exceptions."""
    barrier = threading.Barrier(count)

    def run(index: int) -> T | BaseException:
        barrier.wait()
        try:
            return action(index)
        except Exception as error:  # collected and asserted on by the test
            return error

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(run, range(count)))


def record_vm(records: Records, vm: str = "train-a1-n0", job: str = "train", **overrides: Any):
    fields = {"node_index": 0, "attempt": 1, "provider": "fake", "region": "us-east-1"}
    fields |= {"zone": "us-east-1a"} | overrides
    return records.record_vm(job=job, vm=vm, **fields)


def add_worker(records: Records, database: Database, **overrides: Any) -> WorkerRecord:
    fields: dict[str, Any] = {
        "origin": "existing",
        "provider": None,
        "region": None,
        "label": "lab-box",
        "vm": None,
        "job": None,
        "capabilities": {"gpu": "H100", "gpu_count": 8},
        "state": "idle",
    }
    fields |= overrides
    with database.session() as session:
        worker = records.register_worker(session, **fields)
        session.commit()
    return worker


# ---------------------------------------------------------------------------- VMs


def test_record_vm_is_idempotent_on_the_vm_identity(records: Records, database: Database):
    first = record_vm(records)
    again = record_vm(records, region="eu-west-1", node_index=5)

    assert again.id == first.id
    assert (again.region, again.node_index, again.status) == ("us-east-1", 0, "recorded")
    assert again.instance_ids == []
    assert again.created_at.tzinfo is UTC
    assert len(snapshot(database)["vms"]) == 1


def test_record_vm_refuses_an_identity_owned_by_another_job(records: Records):
    record_vm(records, job="train")
    with pytest.raises(ValueError, match="already recorded for job 'train'"):
        record_vm(records, job="other")


def test_concurrent_record_vm_creates_one_row(records: Records, database: Database):
    results = race(8, lambda _: record_vm(records))

    assert all(not isinstance(result, BaseException) for result in results), results
    assert len({result.id for result in results}) == 1
    assert len(snapshot(database)["vms"]) == 1


def test_vm_instances_status_and_termination_time(records: Records):
    record_vm(records)
    records.set_vm_instances("train-a1-n0", ["i-1", "i-2"], "created")
    vm = records.get_vm("train-a1-n0")
    assert vm is not None
    assert (vm.instance_ids, vm.status, vm.terminated_at) == (["i-1", "i-2"], "created", None)

    records.set_vm_status("train-a1-n0", "terminated")
    terminated = records.get_vm("train-a1-n0")
    assert terminated is not None and terminated.terminated_at is not None
    assert terminated.terminated_at.tzinfo is UTC
    assert terminated.terminated_at - utcnow() < timedelta(seconds=5)

    records.set_vm_status("train-a1-n0", "terminated")
    repeated = records.get_vm("train-a1-n0")
    assert repeated is not None and repeated.terminated_at == terminated.terminated_at


def test_vm_updates_refuse_unknown_vms_and_statuses(records: Records):
    record_vm(records)
    with pytest.raises(KeyError):
        records.set_vm_status("nope", "running")
    with pytest.raises(KeyError):
        records.set_vm_instances("nope", ["i-1"], "created")
    with pytest.raises(ValueError, match="unknown VM status 'Running'"):
        records.set_vm_status("train-a1-n0", "Running")
    assert records.get_vm("nope") is None


def test_vms_for_job_orders_by_attempt_then_node(records: Records):
    for attempt, node in [(2, 1), (1, 1), (2, 0), (1, 0)]:
        record_vm(records, vm=f"train-a{attempt}-n{node}", attempt=attempt, node_index=node)
    record_vm(records, vm="other-a1-n0", job="other")

    ordered = [(vm.attempt, vm.node_index) for vm in records.vms_for_job("train")]
    assert ordered == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert records.vms_for_job("nobody") == []


# ---------------------------------------------------------------------------- join tokens


def test_only_the_token_hash_is_stored(records: Records, database: Database):
    record_vm(records)
    plaintext = records.mint_token(vm="train-a1-n0", ttl=timedelta(minutes=10))
    label_plaintext = records.mint_token(label="lab-box", ttl=timedelta(minutes=10))

    dumped = repr(snapshot(database))
    assert plaintext not in dumped and label_plaintext not in dumped
    assert Records.hash_token(plaintext) in dumped
    assert Records.hash_token(plaintext) == Records.hash_token(plaintext)
    assert len(Records.hash_token(plaintext)) == 64
    assert len(plaintext) >= 43  # 32 random bytes, URL-safe base64


def test_redeem_marks_the_token_used_and_returns_its_binding(records: Records, database: Database):
    record_vm(records)
    plaintext = records.mint_token(vm="train-a1-n0", ttl=timedelta(minutes=10))
    now = utcnow()

    with database.session() as session:
        token = records.redeem_token(session, plaintext, now)
        session.commit()

    assert (token.vm, token.label, token.used_at) == ("train-a1-n0", None, now)
    assert token.expires_at.tzinfo is UTC


def test_redeem_in_a_transaction_that_rolls_back_leaves_the_token_usable(
    records: Records, database: Database
):
    token = records.mint_token(label="lab-box", ttl=timedelta(minutes=10))
    with database.session() as session:
        records.redeem_token(session, token, utcnow())
        session.rollback()
    with database.session() as session:
        assert records.redeem_token(session, token, utcnow()).label == "lab-box"
        session.commit()


def _rejected(records: Records, database: Database, plaintext: str, now: datetime) -> str:
    before = snapshot(database)
    with database.session() as session, pytest.raises(TokenRejected) as rejected:
        records.redeem_token(session, plaintext, now)
    assert snapshot(database) == before, "a rejected redeem must change nothing"
    return rejected.value.reason


def test_a_used_token_is_rejected(records: Records, database: Database):
    record_vm(records)
    plaintext = records.mint_token(vm="train-a1-n0", ttl=timedelta(minutes=10))
    with database.session() as session:
        records.redeem_token(session, plaintext, utcnow())
        session.commit()

    assert _rejected(records, database, plaintext, utcnow()) == "used"


def test_an_expired_token_is_rejected(records: Records, database: Database):
    plaintext = records.mint_token(label="lab-box", ttl=timedelta(minutes=1))
    later = utcnow() + timedelta(minutes=2)

    assert _rejected(records, database, plaintext, later) == "expired"


def test_an_unknown_token_is_rejected(records: Records, database: Database):
    records.mint_token(label="lab-box", ttl=timedelta(minutes=1))

    assert _rejected(records, database, "not-a-token", utcnow()) == "unknown"


def test_minting_again_invalidates_the_earlier_unused_token(records: Records, database: Database):
    record_vm(records)
    used = records.mint_token(vm="train-a1-n0", ttl=timedelta(minutes=10))
    with database.session() as session:
        records.redeem_token(session, used, utcnow())
        session.commit()
    stale = records.mint_token(vm="train-a1-n0", ttl=timedelta(minutes=10))
    fresh = records.mint_token(vm="train-a1-n0", ttl=timedelta(minutes=10))
    other = records.mint_token(label="lab-box", ttl=timedelta(minutes=10))

    assert _rejected(records, database, stale, utcnow()) == "unknown"
    assert _rejected(records, database, used, utcnow()) == "used"  # the used one stays on record
    with database.session() as session:
        assert records.redeem_token(session, fresh, utcnow()).vm == "train-a1-n0"
        assert records.redeem_token(session, other, utcnow()).label == "lab-box"
        session.commit()
    assert len(snapshot(database)["join_tokens"]) == 3


def test_mint_token_needs_exactly_one_binding_and_a_recorded_vm(records: Records):
    with pytest.raises(ValueError, match="exactly one"):
        records.mint_token(ttl=timedelta(minutes=1))
    with pytest.raises(ValueError, match="exactly one"):
        records.mint_token(vm="v", label="l", ttl=timedelta(minutes=1))
    with pytest.raises(ValueError, match="ttl"):
        records.mint_token(label="l", ttl=timedelta(0))
    with pytest.raises(KeyError, match="record the VM"):
        records.mint_token(vm="never-recorded", ttl=timedelta(minutes=1))


def test_the_database_refuses_a_token_with_both_or_no_binding(records: Records, database: Database):
    record_vm(records)
    now = utcnow()
    for vm, label in [(None, None), ("train-a1-n0", "lab-box")]:
        row = JoinToken(token_sha256=f"{vm}{label}", vm=vm, label=label, expires_at=now)
        row.created_at = now
        with database.session() as session, pytest.raises(sa.exc.IntegrityError):
            session.add(row)
            session.commit()


def test_concurrent_redeems_have_exactly_one_winner(records: Records, database: Database):
    record_vm(records)
    plaintext = records.mint_token(vm="train-a1-n0", ttl=timedelta(minutes=10))

    def redeem(_: int) -> JoinToken:
        with database.session() as session:
            token = records.redeem_token(session, plaintext, utcnow())
            session.commit()
            return token

    results = race(8, redeem)

    winners = [result for result in results if isinstance(result, JoinToken)]
    losers = [result for result in results if isinstance(result, TokenRejected)]
    assert len(winners) == 1 and len(losers) == 7, results
    assert {loser.reason for loser in losers} == {"used"}


def test_redeem_needs_an_aware_now(records: Records, database: Database):
    plaintext = records.mint_token(label="lab-box", ttl=timedelta(minutes=1))
    with database.session() as session, pytest.raises(ValueError, match="timezone-aware"):
        records.redeem_token(session, plaintext, datetime.now())


# ---------------------------------------------------------------------------- costs


def test_cost_records_round_trip_in_order(records: Records):
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    actual = records.record_cost(
        job="train", kind="actual", amount=1.5, currency="USD", unit="hour", source="fake:bill"
    )
    estimate = records.record_cost(
        job="train",
        kind="estimate",
        amount=47.84,
        currency="USD",
        unit="hour",
        source="fake:catalogue",
        recorded_at=at,
    )
    records.record_cost(
        job="other", kind="estimate", amount=1, currency="USD", unit="hour", source="x"
    )

    costs = records.costs("train")
    assert [cost.id for cost in costs] == [estimate.id, actual.id]
    assert costs[0].recorded_at == at and costs[0].recorded_at.tzinfo is UTC
    assert (costs[0].kind, costs[0].amount) == ("estimate", 47.84)
    assert costs[0].source == "fake:catalogue"
    with pytest.raises(ValueError, match="cost kind"):
        records.record_cost(job="t", kind="guess", amount=1, currency="USD", unit="h", source="s")
    with pytest.raises(ValueError, match="timezone-aware"):
        records.record_cost(
            job="t",
            kind="actual",
            amount=1,
            currency="USD",
            unit="h",
            source="s",
            recorded_at=datetime(2026, 1, 1),
        )


# ---------------------------------------------------------------------------- blocks


def test_block_is_active_until_it_expires(records: Records):
    block = records.record_block(
        scope="offer",
        key="fake/us-east-1/h100x8",
        kind="Capacity",
        message="no capacity",
        job="train",
        ttl=timedelta(minutes=10),
    )
    now = utcnow()

    assert [b.id for b in records.active_blocks(now)] == [block.id]
    assert records.active_blocks(block.expires_at - timedelta(microseconds=1)) != []
    assert records.active_blocks(block.expires_at) == []
    assert records.active_blocks(now + timedelta(minutes=11)) == []
    assert block.expires_at.tzinfo is UTC and block.created_at <= now


def test_a_new_error_refreshes_the_block_and_only_extends_it(records: Records):
    key = "fake/us-east-1"
    first = records.record_block(
        scope="region", key=key, kind="Quota", message="quota", job="a", ttl=timedelta(hours=1)
    )
    shorter = records.record_block(
        scope="region",
        key=key,
        kind="Capacity",
        message="stockout",
        job="b",
        ttl=timedelta(minutes=1),
    )
    assert shorter.id == first.id
    assert (shorter.kind, shorter.message, shorter.job) == ("Capacity", "stockout", "b")
    assert shorter.expires_at == first.expires_at  # a shorter TTL never shortens a block

    longer = records.record_block(
        scope="region", key=key, kind="Quota", message="q2", job="c", ttl=timedelta(hours=2)
    )
    assert longer.id == first.id and longer.expires_at > first.expires_at
    assert longer.created_at == first.created_at

    other_scope = records.record_block(
        scope="offer", key=key, kind="Capacity", message="m", job="a", ttl=timedelta(hours=1)
    )
    assert other_scope.id != first.id
    assert len(records.active_blocks(utcnow())) == 2


def test_block_validates_scope_kind_and_ttl(records: Records):
    good: dict[str, Any] = {
        "scope": "offer",
        "key": "k",
        "kind": "Capacity",
        "message": "m",
        "job": "j",
        "ttl": timedelta(minutes=1),
    }
    for field, value in [("scope", "zone"), ("kind", "capacity"), ("ttl", timedelta(0))]:
        with pytest.raises(ValueError):
            records.record_block(**(good | {field: value}))
    with pytest.raises(ValueError, match="timezone-aware"):
        records.active_blocks(datetime(2026, 1, 1))


def test_concurrent_jobs_recording_one_block_leave_one_row(records: Records, database: Database):
    def block(index: int):
        return records.record_block(
            scope="offer",
            key="fake/us-east-1/h100x8",
            kind="Capacity",
            message=f"stockout seen by job {index}",
            job=f"job-{index}",
            ttl=timedelta(minutes=index + 1),
        )

    results = race(8, block)

    assert all(not isinstance(result, BaseException) for result in results), results
    rows = snapshot(database)["blocks"]
    assert len(rows) == 1
    [active] = records.active_blocks(utcnow())
    assert active.expires_at == max(result.expires_at for result in results)


# ---------------------------------------------------------------------------- workers


def test_register_worker_joins_the_callers_transaction(records: Records, database: Database):
    capabilities = {
        "gpu": "H100",
        "gpu_count": 8,
        "gpus": [{"index": 0, "memory_gb": 79.6, "ok": True}],
        "runtime": None,
        "note": "ünïcode ✓",
    }
    with database.session() as session:
        worker = add_worker(records, database)  # committed by the helper
        pending = records.register_worker(
            session,
            origin="managed",
            provider="fake",
            region="us-east-1",
            label=None,
            vm="train-a1-n0",
            job="train",
            capabilities=capabilities,
            state="reserved",
        )
        assert len(pending.id) == 32
        session.rollback()
    assert records.get_worker(pending.id) is None

    with database.session() as session:
        kept = records.register_worker(
            session,
            origin="managed",
            provider="fake",
            region="us-east-1",
            label=None,
            vm="train-a1-n0",
            job="train",
            capabilities=capabilities,
            state="reserved",
        )
        session.commit()
    stored = records.get_worker(kept.id)
    assert stored is not None and stored.capabilities == capabilities
    assert stored.registered_at.tzinfo is UTC
    assert [w.id for w in records.workers_for_job("train")] == [kept.id]
    assert records.get_worker(worker.id) is not None


def test_register_worker_validates_origin_and_state(records: Records, database: Database):
    with pytest.raises(ValueError, match="worker origin"):
        add_worker(records, database, origin="cloud")
    with pytest.raises(ValueError, match="worker state"):
        add_worker(records, database, state="ready")


def test_reserve_worker_takes_the_oldest_eligible_idle_existing_worker(
    records: Records, database: Database
):
    add_worker(records, database, label="managed", origin="managed")
    add_worker(records, database, label="busy", state="busy", job="other")
    too_small = add_worker(records, database, label="small", capabilities={"gpu_count": 1})
    first = add_worker(records, database, label="first")
    add_worker(records, database, label="second")

    seen: list[str] = []

    def eligible(worker: WorkerRecord) -> bool:
        seen.append(worker.label or "")
        return worker.capabilities.get("gpu_count", 0) >= 8

    reserved = records.reserve_worker(job="train", eligible=eligible)

    assert reserved is not None and reserved.id == first.id
    assert (reserved.state, reserved.job) == ("reserved", "train")
    assert seen == ["small", "first"]
    assert records.reserve_worker(job="x", eligible=lambda w: w.id == too_small.id) is not None
    assert records.reserve_worker(job="y", eligible=lambda w: False) is None


def test_mark_placed_makes_the_rows_running_and_the_reserved_workers_busy_in_one_go(
    records: Records, database: Database
):
    for index in range(3):
        record_vm(records, vm=f"train-a1-n{index}", node_index=index)
    reserved = add_worker(records, database, label="reserved", state="reserved", job="train")
    idle = add_worker(records, database, label="idle")
    revoked = add_worker(records, database, label="gone", state="revoked", job="train")
    vms = ["train-a1-n0", "train-a1-n1", "train-a1-n2", "train-a1-never-created"]

    records.mark_placed("train", vms, [reserved.id, idle.id, revoked.id, "no-such-worker"])

    assert {vm.vm: vm.status for vm in records.get_vms(vms).values()} == {
        f"train-a1-n{index}": "running" for index in range(3)
    }
    states = {
        worker.label: (worker.state, worker.job)
        for worker in map(records.get_worker, (reserved.id, idle.id, revoked.id))
        if worker is not None
    }
    assert states == {
        "reserved": ("busy", "train"),
        "idle": ("idle", None),
        "gone": ("revoked", "train"),
    }
    records.mark_placed("train", vms, [reserved.id])  # a retried step changes nothing more
    assert records.get_worker(reserved.id).state == "busy"  # type: ignore[union-attr]


def test_sixteen_threads_racing_for_one_worker_one_wins(records: Records, database: Database):
    worker = add_worker(records, database)

    results = race(16, lambda index: records.reserve_worker(job=f"job-{index}", eligible=bool))

    assert not [result for result in results if isinstance(result, BaseException)], results
    winners = [result for result in results if isinstance(result, WorkerRecord)]
    assert len(winners) == 1
    stored = records.get_worker(worker.id)
    assert stored is not None and (stored.state, stored.job) == ("reserved", winners[0].job)


def test_two_engines_racing_for_three_workers_reserve_each_once(
    records: Records, database: Database, database_url: str
):
    workers = {add_worker(records, database, label=f"box-{i}").id for i in range(3)}
    other = Database(database_url)
    try:
        both = [records, Records(other)]
        results = race(
            16, lambda index: both[index % 2].reserve_worker(job=f"job-{index}", eligible=bool)
        )
    finally:
        other.dispose()

    assert not [result for result in results if isinstance(result, BaseException)], results
    winners = [result for result in results if isinstance(result, WorkerRecord)]
    assert sorted(w.id for w in winners) == sorted(workers)
    assert len({w.job for w in winners}) == 3
    for winner in winners:
        stored = records.get_worker(winner.id)
        assert stored is not None and (stored.state, stored.job) == ("reserved", winner.job)


RESERVE_IN_A_PROCESS = textwrap.dedent(
    """
    import sys
    from gpuprov.store.db import Database
    from gpuprov.store.records import Records

    url, job = sys.argv[1], sys.argv[2]
    database = Database(url)
    records = Records(database)
    print("ready", flush=True)
    sys.stdin.readline()  # the go signal, sent once every process is ready
    worker = records.reserve_worker(job=job, eligible=bool)
    print(worker.id if worker else "none", flush=True)
    database.dispose()
    """
)


def test_separate_processes_racing_for_one_worker_one_wins(
    records: Records, database: Database, database_url: str
):
    worker = add_worker(records, database)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", RESERVE_IN_A_PROCESS, database_url, f"job-{index}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for index in range(4)
    ]
    for process in processes:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    outcomes = [process.communicate(timeout=60)[0].strip() for process in processes]

    assert all(process.returncode == 0 for process in processes)
    assert sorted(outcomes, key=lambda outcome: outcome == "none") == [worker.id] + ["none"] * 3
    stored = records.get_worker(worker.id)
    assert stored is not None and stored.job == f"job-{outcomes.index(worker.id)}"


def test_set_worker_state(records: Records, database: Database):
    worker = add_worker(records, database)
    records.set_worker_state(worker.id, "busy", "train")
    stored = records.get_worker(worker.id)
    assert stored is not None and (stored.state, stored.job) == ("busy", "train")
    assert stored.updated_at >= worker.updated_at
    with pytest.raises(KeyError):
        records.set_worker_state("missing", "idle", None)
    with pytest.raises(ValueError):
        records.set_worker_state(worker.id, "gone", None)


def test_release_returns_existing_workers_and_revokes_managed_ones(
    records: Records, database: Database
):
    existing = add_worker(records, database, state="busy", job="train")
    managed = add_worker(
        records,
        database,
        origin="managed",
        provider="fake",
        region="us-east-1",
        label=None,
        vm="train-a1-n0",
        state="busy",
        job="train",
    )
    other_job = add_worker(records, database, state="reserved", job="other")
    revoked_before = add_worker(records, database, origin="managed", state="revoked", job="train")

    released = records.release_job_workers("train")

    assert [(w.id, w.state, w.job) for w in released] == [
        (existing.id, "idle", None),
        (managed.id, "revoked", "train"),
    ]
    stored_other = records.get_worker(other_job.id)
    assert stored_other is not None and stored_other.state == "reserved"
    stored_revoked = records.get_worker(revoked_before.id)
    assert stored_revoked is not None and stored_revoked.updated_at == revoked_before.updated_at
    assert records.release_job_workers("train") == []
    assert records.reserve_worker(job="next", eligible=bool) is not None


# ---------------------------------------------------------------------------- orphans


def test_orphan_upserts_while_open_and_starts_over_once_resolved(records: Records):
    first = records.record_orphan(
        provider="fake",
        region="us-east-1",
        zone="us-east-1a",
        vm="train-a1-n0",
        instance_ids=["i-1"],
        error="Transient: delete timed out",
    )
    again = records.record_orphan(
        provider="fake",
        region="us-east-1",
        zone="us-east-1a",
        vm="train-a1-n0",
        instance_ids=["i-1", "i-2"],
        error="Failed: still running",
    )

    assert again.id == first.id and again.attempts == 2
    assert (again.instance_ids, again.last_error) == (["i-1", "i-2"], "Failed: still running")
    assert again.first_seen == first.first_seen and again.last_seen >= first.last_seen
    assert [orphan.id for orphan in records.open_orphans()] == [first.id]

    records.resolve_orphan("train-a1-n0")
    records.resolve_orphan("train-a1-n0")  # idempotent
    assert records.open_orphans() == []

    reopened = records.record_orphan(
        provider="fake",
        region="us-east-1",
        zone=None,
        vm="train-a1-n0",
        instance_ids=["i-3"],
        error="again",
    )
    assert reopened.id != first.id and reopened.attempts == 1
    assert [orphan.id for orphan in records.open_orphans()] == [reopened.id]


def test_a_jobs_repeated_orphan_record_does_not_count_as_a_retry(records: Records):
    """A job's teardown record that runs again (a re-run local activity) leaves the attempts
    the reconciler's backoff is computed from as they were."""
    where = dict(provider="fake", region="r1", zone=None, vm="train-a1-n0", instance_ids=[])
    records.record_orphan(**where, error="Credentials at wait_gone", retried=False)
    again = records.record_orphan(**where, error="Credentials at wait_gone", retried=False)
    assert again.attempts == 1
    assert records.record_orphan(**where, error="the reconciler's try").attempts == 2


def test_concurrent_orphan_reports_keep_one_open_row(records: Records, database: Database):
    def report(index: int):
        return records.record_orphan(
            provider="fake",
            region="us-east-1",
            zone=None,
            vm="train-a1-n0",
            instance_ids=[f"i-{index}"],
            error=f"attempt {index}",
        )

    results = race(8, report)

    assert not [result for result in results if isinstance(result, BaseException)], results
    [orphan] = records.open_orphans()
    assert orphan.attempts == 8
    assert len(snapshot(database)["orphans"]) == 1


def test_returned_rows_are_readable_after_their_session(records: Records):
    vm = record_vm(records)
    fetched = records.get_vm(vm.vm)
    listed = records.vms_for_job("train")
    assert fetched is not None and fetched.instance_ids == [] and listed[0].region == "us-east-1"
