"""The shared capacity backoff and launch budget (gpuprov/store/capacity.py) on a real database:
SQLite and PostgreSQL 15 (conftest's `records` fixture runs each test on both)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuprov.store.capacity import CapacityBackoff, LaunchBudget
from gpuprov.store.records import Records
from tests.gpuprov.test_records import race

pytestmark = pytest.mark.slow  # PostgreSQL too: docs/testing.md, "The fast lane"

KEY = "fake/us-east-1/h100x8"
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
BACKOFF = CapacityBackoff(timedelta(minutes=2), timedelta(minutes=30))


def _stockout(records: Records, now: datetime, job: str = "train", kind: str = "Capacity"):
    return records.record_block(
        scope="offer",
        key=KEY,
        kind=kind,
        message="insufficient capacity",
        job=job,
        ttl=timedelta(minutes=15),
        now=now,
        backoff=BACKOFF,
    )


def test_a_capacity_block_backs_off_two_minutes_doubling_to_thirty(records: Records):
    lasted, now = [], T0
    for _ in range(7):
        block = _stockout(records, now)
        lasted.append((block.expires_at - now) / timedelta(minutes=1))
        now = block.expires_at + timedelta(seconds=1)  # the next try, once it lapsed
    assert lasted == [2, 4, 8, 16, 30, 30, 30]


def test_failures_while_the_block_is_active_count_once(records: Records):
    first = _stockout(records, T0)
    for job in range(50):  # fifty jobs whose attempts started before the block
        again = _stockout(records, T0 + timedelta(seconds=30), job=f"j{job}")
    assert again.strikes == first.strikes == 1
    assert again.expires_at == T0 + timedelta(seconds=30) + timedelta(minutes=2)


def test_a_long_quiet_spell_starts_the_backoff_over(records: Records):
    block = _stockout(records, T0)
    block = _stockout(records, block.expires_at + timedelta(seconds=1))
    assert block.strikes == 2
    later = block.expires_at + BACKOFF.forget_after + timedelta(seconds=1)
    assert _stockout(records, later).strikes == 1


def test_other_kinds_keep_the_flat_block_ttl(records: Records):
    block = _stockout(records, T0, kind="Failed")
    assert block.expires_at - T0 == timedelta(minutes=15) and block.strikes == 0


def test_the_launch_budget_grants_a_few_probes_per_window(records: Records):
    budget = LaunchBudget(records.db, probes=2, window=timedelta(minutes=1))
    assert budget.claim(KEY, T0).granted  # no history: free, and nothing written
    block = _stockout(records, T0)
    lapsed = block.expires_at
    grants = [budget.claim(KEY, lapsed + timedelta(seconds=i)) for i in range(5)]
    assert [g.granted for g in grants] == [True, True, False, False, False]
    assert all(g.probe for g in grants[:2])
    assert grants[2].retry_at == lapsed + timedelta(minutes=1)
    # the next window grants again
    assert budget.claim(KEY, lapsed + timedelta(minutes=1, seconds=1)).granted


def test_a_failed_probe_blocks_the_others_and_a_success_frees_them(records: Records):
    budget = LaunchBudget(records.db, probes=1, window=timedelta(minutes=1))
    lapsed = _stockout(records, T0).expires_at
    assert budget.claim(KEY, lapsed).granted
    refused = budget.claim(KEY, lapsed + timedelta(seconds=1))
    assert not refused.granted
    again = _stockout(records, lapsed + timedelta(seconds=2))  # the probe failed
    assert again.strikes == 2
    blocked = budget.claim(KEY, lapsed + timedelta(seconds=3))
    assert not blocked.granted and blocked.retry_at == again.expires_at
    assert budget.claim(KEY, again.expires_at).granted  # the next probe
    budget.came_back(KEY)  # ... made its nodes ready
    free = [budget.claim(KEY, again.expires_at + timedelta(seconds=1)) for _ in range(5)]
    assert all(g.granted and not g.probe for g in free)


def test_concurrent_claims_never_take_more_than_the_budget(records: Records):
    budget = LaunchBudget(records.db, probes=3, window=timedelta(minutes=1))
    lapsed = _stockout(records, T0).expires_at
    grants = race(12, lambda _: budget.claim(KEY, lapsed))
    assert sum(1 for g in grants if not isinstance(g, BaseException) and g.granted) == 3
    assert not [g for g in grants if isinstance(g, BaseException)]
