"""Worker liveness (gpuprov/store/liveness.py), on SQLite and PostgreSQL: heartbeats,
lost workers, the changed/notified pair the sweep wakes jobs by, drains and removals."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpuprov.store.credentials import Credentials, issue_worker_credential
from gpuprov.store.db import WorkerRecord, utcnow
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

HEALTHY: dict[str, Any] = {"gpus": [{"name": "NVIDIA H100"}], "gpu_runtime_ok": True}
BROKEN: dict[str, Any] = {"gpu_runtime_ok": False, "gpu_runtime_error": "nvidia-smi exited 18"}


def register(
    records: Records,
    *,
    job: str | None = None,
    capabilities: dict[str, Any] = HEALTHY,
    origin: str = "existing",
) -> tuple[WorkerRecord, str]:
    """A registered worker (as the API writes it) and its credential."""
    with records.db.session() as session:
        worker = records.register_worker(
            session,
            origin=origin,
            provider=None,
            region=None,
            label="box",
            vm=None,
            job=job,
            capabilities=capabilities,
            state="reserved" if job else "idle",
        )
        credential = issue_worker_credential(session, worker.id)
        session.commit()
    return worker, credential


def row(records: Records, worker_id: str) -> WorkerRecord:
    found = records.get_worker(worker_id)
    assert found is not None
    return found


def test_a_registration_is_the_first_sign_of_life_and_its_verdict_the_first_health(
    records: Records,
):
    healthy, _ = register(records)
    broken, _ = register(records, capabilities=BROKEN)

    for worker in (row(records, healthy.id), row(records, broken.id)):
        assert worker.last_seen_at == worker.registered_at
        assert (worker.heartbeats, worker.liveness, worker.draining) == (0, "alive", False)
        assert worker.changed_at is None and worker.notified_at is None
    assert (row(records, healthy.id).health, row(records, healthy.id).health_detail) == (
        "healthy",
        None,
    )
    assert (row(records, broken.id).health, row(records, broken.id).health_detail) == (
        "unhealthy",
        "nvidia-smi exited 18",
    )


def test_heartbeats_count_and_only_a_change_of_health_moves_changed_at(records: Records):
    liveness = Liveness(records.db)
    worker, _ = register(records, job="train")

    first = liveness.heartbeat(worker.id, healthy=True, detail=None)
    second = liveness.heartbeat(worker.id, healthy=True, detail=None)

    assert first is not None and second is not None
    assert (second.state, second.draining, second.changed) == ("reserved", False, False)
    seen = row(records, worker.id)
    assert seen.heartbeats == 2 and seen.last_seen_at is not None
    assert seen.last_seen_at > worker.registered_at and seen.changed_at is None
    assert liveness.pending() == []

    ecc = "GPU 00000000:53:00.0: 1 uncorrectable ECC error (Xid 48)"
    sick = liveness.heartbeat(worker.id, healthy=False, detail=ecc)
    assert sick is not None and sick.changed
    changed = row(records, worker.id)
    assert (changed.health, changed.health_detail, changed.heartbeats) == ("unhealthy", ecc, 3)
    assert changed.changed_at == changed.last_seen_at
    assert [w.id for w in liveness.pending()] == [worker.id]

    # The same verdict again, with other words: no new change.
    again = liveness.heartbeat(worker.id, healthy=False, detail=ecc + "; row remap pending")
    assert again is not None and not again.changed
    assert row(records, worker.id).changed_at == changed.changed_at


def test_a_silent_worker_is_lost_once_and_a_heartbeat_brings_it_back(records: Records):
    liveness = Liveness(records.db)
    quiet, _ = register(records, job="train")
    chatty, _ = register(records, job="train")
    idle, _ = register(records)
    later = utcnow() + timedelta(seconds=100)
    liveness.heartbeat(chatty.id, healthy=True, detail=None, now=later)

    lost = liveness.mark_lost(timedelta(seconds=90), now=later + timedelta(seconds=1))

    assert sorted(w.id for w in lost) == sorted([quiet.id, idle.id])
    assert {row(records, w).liveness for w in (quiet.id, idle.id)} == {"lost"}
    assert row(records, chatty.id).liveness == "alive"
    assert liveness.mark_lost(timedelta(seconds=90), now=later + timedelta(seconds=2)) == []
    # Only workers of a job are waiting to be told; an idle worker has no job to tell.
    assert [w.id for w in liveness.pending()] == [quiet.id]

    back = liveness.heartbeat(quiet.id, healthy=True, detail=None)
    assert back is not None and back.changed
    assert row(records, quiet.id).liveness == "alive"


def test_the_sweep_records_what_it_told_and_a_newer_change_stays_pending(records: Records):
    liveness = Liveness(records.db)
    worker, _ = register(records, job="train")
    liveness.heartbeat(worker.id, healthy=False, detail="lost a GPU")
    [told] = liveness.pending()
    assert told.changed_at is not None

    liveness.heartbeat(worker.id, healthy=True, detail=None)  # changed again meanwhile

    assert not liveness.notified(worker.id, told.changed_at)
    [still] = liveness.pending()
    assert still.changed_at is not None and still.changed_at != told.changed_at
    assert liveness.notified(worker.id, still.changed_at)
    assert liveness.pending() == []
    assert row(records, worker.id).notified_at == still.changed_at


def test_a_revoked_worker_heartbeats_nothing_into_the_database(records: Records):
    liveness = Liveness(records.db)
    worker, _ = register(records, job="train")
    records.set_worker_state(worker.id, "revoked", "train")
    before = row(records, worker.id)

    assert liveness.heartbeat(worker.id, healthy=False, detail="x") is None
    assert liveness.heartbeat("no-such-worker", healthy=True, detail=None) is None

    assert row(records, worker.id) == before


def test_drained_and_lost_workers_are_never_reserved(records: Records):
    liveness = Liveness(records.db)
    drained, _ = register(records)
    lost, _ = register(records)
    assert liveness.set_draining(drained.id, True) is not None
    liveness.mark_lost(timedelta(seconds=1), now=utcnow() + timedelta(seconds=5))
    liveness.heartbeat(drained.id, healthy=True, detail=None)  # alive again, still draining

    assert records.reserve_worker(job="j1", eligible=lambda _: True) is None

    undrained = liveness.set_draining(drained.id, False)
    assert undrained is not None and not undrained.draining
    reserved = records.reserve_worker(job="j1", eligible=lambda _: True)
    assert reserved is not None and reserved.id == drained.id
    assert row(records, lost.id).state == "idle"
    assert liveness.set_draining("no-such-worker", True) is None


def test_removing_a_worker_revokes_its_credential_and_wakes_its_job(records: Records):
    liveness = Liveness(records.db)
    credentials = Credentials(records.db)
    worker, credential = register(records, job="train")
    assert credentials.worker(credential) is not None

    removed = liveness.remove(worker.id)

    assert removed is not None and removed.state == "revoked" and removed.job == "train"
    assert credentials.worker(credential) is None
    assert [w.id for w in liveness.pending()] == [worker.id]
    assert liveness.remove(worker.id) is None  # once
    assert [w.id for w in liveness.of_job("train")] == [worker.id]
