"""Operator API keys and worker credentials (gpuprov/store/credentials.py), on SQLite
and PostgreSQL: only SHA-256 digests are stored, a refused secret changes nothing, and a
worker's credential is revoked wherever the worker is revoked or its machine released."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from gpuprov.store.credentials import Credentials, issue_worker_credential, sha256
from gpuprov.store.db import OperatorKey, WorkerCredential, utcnow
from gpuprov.store.records import Records
from tests.gpuprov.test_records import snapshot

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

CAPABILITIES = {"gpus": [], "gpu_runtime_ok": False}


@pytest.fixture
def credentials(records: Records) -> Credentials:
    return Credentials(records.db)


def register(records: Records, *, vm: str | None = None, job: str | None = None) -> tuple[str, str]:
    """A worker row and its credential, as a registration makes them: (worker id, credential)."""
    if vm is not None:
        records.record_vm(
            job=job or "train",
            node_index=0,
            attempt=1,
            vm=vm,
            provider="fake",
            region="r1",
            zone=None,
        )
    with records.db.session() as session:
        worker = records.register_worker(
            session,
            origin="managed" if vm else "existing",
            provider="fake" if vm else None,
            region="r1" if vm else None,
            label=None if vm else "box-1",
            vm=vm,
            job=job,
            capabilities=CAPABILITIES,
            state="reserved" if vm else "idle",
        )
        credential = issue_worker_credential(session, worker.id)
        session.commit()
    return worker.id, credential


def stored_secrets(records: Records) -> str:
    return repr(snapshot(records.db))


# ---------------------------------------------------------------- operator keys


def test_an_operator_key_is_shown_once_and_stored_as_its_digest(
    records: Records, credentials: Credentials
):
    row, key = credentials.create_operator_key("ci-deployer")

    assert key.startswith(f"gpo_{row.id}_") and len(key.split("_", 2)[2]) >= 43
    assert key not in stored_secrets(records)
    with records.db.session() as session:
        [stored] = session.execute(sa.select(OperatorKey)).scalars().all()
    assert (stored.name, stored.secret_sha256, stored.revoked_at) == (
        "ci-deployer",
        sha256(key),
        None,
    )
    assert credentials.operator(key) == stored


def test_only_the_exact_live_key_is_accepted_and_a_refusal_changes_nothing(
    records: Records, credentials: Credentials
):
    row, key = credentials.create_operator_key("ops")
    _, credential = register(records)
    other_row, _ = credentials.create_operator_key("other")
    before = snapshot(records.db)

    tampered = key[:-1] + ("A" if key[-1] != "A" else "B")
    borrowed_id = key.replace(row.id, other_row.id)  # another key's id, this key's secret
    for wrong in ["", "gpo_", tampered, borrowed_id, credential, key + "x", key.upper()]:
        assert credentials.operator(wrong) is None, wrong
    assert snapshot(records.db) == before


def test_revoking_by_id_or_by_name_and_listing(credentials: Credentials):
    first, first_key = credentials.create_operator_key("ci")
    second, second_key = credentials.create_operator_key("ci")
    third, third_key = credentials.create_operator_key("grafana")

    assert [row.id for row in credentials.revoke_operator_keys(first.id)] == [first.id]
    assert credentials.operator(first_key) is None
    assert credentials.operator(second_key) is not None
    assert [row.id for row in credentials.operator_keys()] == [second.id, third.id]

    assert [row.id for row in credentials.revoke_operator_keys("ci")] == [second.id]
    assert credentials.revoke_operator_keys("ci") == []  # a repeat revokes nothing
    assert credentials.revoke_operator_keys("no-such-key") == []
    assert [row.id for row in credentials.operator_keys()] == [third.id]
    everything = credentials.operator_keys(include_revoked=True)
    assert [(row.id, row.revoked_at is not None) for row in everything] == [
        (first.id, True),
        (second.id, True),
        (third.id, False),
    ]


@pytest.mark.parametrize("name", ["", "   ", "x" * 129])
def test_an_operator_key_needs_a_name(credentials: Credentials, name: str):
    with pytest.raises(ValueError, match="name must be 1-128 characters"):
        credentials.create_operator_key(name)


# ---------------------------------------------------------------- worker credentials


def test_a_worker_credential_names_its_live_worker(records: Records, credentials: Credentials):
    worker_id, credential = register(records, vm="train-a1-n0", job="train")

    assert credential.startswith("gpw_") and credential not in stored_secrets(records)
    worker = credentials.worker(credential)
    assert worker is not None and worker.id == worker_id
    assert credentials.operator(credential) is None  # never an operator's key
    assert credentials.worker(credential[:-2]) is None


def _live(records: Records, worker_id: str) -> bool:
    with records.db.session() as session:
        rows = session.execute(
            sa.select(WorkerCredential).where(WorkerCredential.worker_id == worker_id)
        ).scalars()
        return any(row.revoked_at is None for row in rows)


def test_the_machine_released_revokes_its_workers_credential(
    records: Records, credentials: Credentials
):
    worker_id, credential = register(records, vm="train-a1-n0", job="train")
    other_id, other = register(records, vm="train-a1-n1", job="train")

    records.vm_terminated("train-a1-n0")

    assert credentials.worker(credential) is None and not _live(records, worker_id)
    assert credentials.worker(other) is not None and _live(records, other_id)


def test_a_released_job_revokes_managed_credentials_and_keeps_existing_ones(
    records: Records, credentials: Credentials
):
    managed_id, managed = register(records, vm="train-a1-n0", job="train")
    existing_id, existing = register(records)
    records.reserve_worker(job="train", eligible=lambda worker: True)

    records.release_job_workers("train")

    assert credentials.worker(managed) is None and not _live(records, managed_id)
    # An existing worker goes back to idle: it is the same machine, still enrolled.
    worker = credentials.worker(existing)
    assert worker is not None and (worker.id, worker.state) == (existing_id, "idle")


def test_a_worker_set_revoked_loses_its_credential(records: Records, credentials: Credentials):
    worker_id, credential = register(records)

    records.set_worker_state(worker_id, "busy", "train")
    assert credentials.worker(credential) is not None
    records.set_worker_state(worker_id, "revoked", None)

    assert credentials.worker(credential) is None and not _live(records, worker_id)


def test_a_revoked_worker_is_refused_even_with_a_live_credential_row(
    records: Records, credentials: Credentials
):
    """Whatever path revokes a worker, its credential stops working with it."""
    worker_id, credential = register(records)
    with records.db.session() as session:
        session.execute(
            sa.text("UPDATE workers SET state = 'revoked' WHERE id = :id"), {"id": worker_id}
        )
        session.commit()
    assert _live(records, worker_id)
    assert credentials.worker(credential) is None


def test_an_undone_registration_leaves_no_credential(records: Records, credentials: Credentials):
    token = records.mint_token(label="box-1", ttl=timedelta(hours=1))
    before = snapshot(records.db)
    with records.db.session() as session:
        records.redeem_token(session, token, utcnow())
        worker = records.register_worker(
            session,
            origin="existing",
            provider=None,
            region=None,
            label="box-1",
            vm=None,
            job=None,
            capabilities=CAPABILITIES,
            state="idle",
        )
        credential = issue_worker_credential(session, worker.id)
        session.commit()

    records.undo_registration(Records.hash_token(token), worker.id)

    assert snapshot(records.db) == before
    assert credentials.worker(credential) is None
