"""Claims on owned machines: one holder per host, across processes, on SQLite and PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from providers.ssh.claims import ClaimStore

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"


@pytest.fixture
def store(database_url: str) -> ClaimStore:
    """The `database_url` fixture gives a fresh SQLite file and a fresh PostgreSQL database."""
    store = ClaimStore(database_url)
    yield store
    store.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> ClaimStore:
    """For bookkeeping that has no race in it: SQLite only, to keep the suite fast."""
    store = ClaimStore(f"sqlite:///{tmp_path / 'claims.db'}")
    yield store
    store.close()


def test_racing_claims_have_exactly_one_winner(database_url: str, store: ClaimStore) -> None:
    """Eight workers (each its own engine and connections) claim one host at once."""
    stores = [ClaimStore(database_url) for _ in range(8)]
    try:
        with ThreadPoolExecutor(len(stores)) as pool:
            holders = list(
                pool.map(lambda i: stores[i].claim("box", f"vm-{i}", "owned"), range(len(stores)))
            )
    finally:
        for other in stores:
            other.close()
    assert len(set(holders)) == 1
    assert store.held() == {"box": holders[0]}


def test_a_claim_is_idempotent_for_its_holder_and_only_the_holder_releases(
    store: ClaimStore,
) -> None:
    assert store.claim("box", "vm-a", "owned") == "vm-a"
    assert store.claim("box", "vm-a", "owned") == "vm-a"  # a retried create
    assert store.claim("box", "vm-b", "owned") == "vm-a"
    assert store.release("vm-b", "owned", ["box"]) == []
    assert store.held_in("owned") == {"vm-a": ["box"]}
    assert store.release("vm-a", "owned", ["box", "unknown"]) == ["box"]
    assert store.held() == {}
    assert store.claim("box", "vm-b", "owned") == "vm-b"


def test_the_claim_log_outlives_the_claim_and_remembers_reachability(
    sqlite_store: ClaimStore,
) -> None:
    sqlite_store.claim("box", "vm-a", "owned")
    sqlite_store.claim("other", "vm-a", "owned")
    sqlite_store.mark_reached("vm-a", "box")
    sqlite_store.release("vm-a", "owned")
    assert sqlite_store.held() == {}
    assert sqlite_store.hosts_used_by("vm-a", "owned") == ["box", "other"]
    assert sqlite_store.hosts_used_by("vm-a", "owned", reached_only=True) == ["box"]
    assert sqlite_store.hosts_used_by("vm-a", "elsewhere") == []


def test_held_in_lists_by_vm_within_a_region(sqlite_store: ClaimStore) -> None:
    sqlite_store.claim("a", "vm-1", "lab")
    sqlite_store.claim("b", "vm-1", "lab")
    sqlite_store.claim("c", "vm-2", "lab")
    sqlite_store.claim("d", "vm-3", "home")
    assert sqlite_store.held_in("lab") == {"vm-1": ["a", "b"], "vm-2": ["c"]}
    assert sqlite_store.held_in("lab", "vm-2") == {"vm-2": ["c"]}


def test_the_first_pinned_key_stays_until_unpinned(sqlite_store: ClaimStore) -> None:
    assert sqlite_store.pinned_key("10.0.0.5:22") is None
    assert sqlite_store.pin("10.0.0.5:22", "ssh-ed25519 FIRST") == "ssh-ed25519 FIRST"
    assert sqlite_store.pin("10.0.0.5:22", "ssh-ed25519 SECOND") == "ssh-ed25519 FIRST"
    assert sqlite_store.unpin("10.0.0.5:22") and not sqlite_store.unpin("10.0.0.5:22")
    assert sqlite_store.pin("10.0.0.5:22", "ssh-ed25519 SECOND") == "ssh-ed25519 SECOND"


def test_a_second_store_on_the_same_database_sees_the_same_claims(database_url: str) -> None:
    first, second = ClaimStore(database_url), ClaimStore(database_url)
    try:
        first.claim("box", "vm-a", "owned")
        assert second.holder("box") == "vm-a"
    finally:
        first.close()
        second.close()
