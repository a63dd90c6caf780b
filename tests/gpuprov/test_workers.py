"""`gpuprov workers` (the database) and the SDK's WorkersClient (the real API over HTTP): the
same list, the same drain, undrain and remove."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from gpuprov.api.app import create_app, serving
from gpuprov.cli import main as cli
from gpuprov.cli.dev import free_port
from gpuprov.cli.workers import workers_text
from gpuprov.engine.worker import open_records
from gpuprov.sdk.client import GpuprovError, WorkerNotFound, WorkersClient
from gpuprov.store.credentials import Credentials, issue_worker_credential
from gpuprov.store.db import utcnow
from gpuprov.store.liveness import Liveness
from gpuprov.store.records import Records
from tests.gpuprov.test_api import CAPABILITIES


def register(records: Records, label: str, job: str | None = None) -> str:
    with records.db.session() as session:
        worker = records.register_worker(
            session,
            origin="managed" if job else "existing",
            provider="fake" if job else None,
            region="r1" if job else None,
            label=label,
            vm=f"{job}-a1-n0" if job else None,
            job=job,
            capabilities=CAPABILITIES,
            state="busy" if job else "idle",
        )
        issue_worker_credential(session, worker.id)
        session.commit()
    return worker.id


@pytest.fixture
def database_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Records]:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.delenv("GPUPROV_CONFIG", raising=False)
    monkeypatch.setenv("GPUPROV_DATABASE__URL", url)
    records = open_records(url)
    yield records
    records.db.dispose()


def test_gpuprov_workers_lists_drains_and_removes(database_file: Records, capsys):
    records = database_file
    idle = register(records, "box-1")
    busy = register(records, "node", job="train")
    Liveness(records.db).heartbeat(busy, healthy=False, detail="GPU 0000:A8:00.0 is lost")
    Liveness(records.db).mark_lost(timedelta(seconds=5), now=utcnow() + timedelta(minutes=1))

    assert cli.main(["workers"]) == 0
    listed = capsys.readouterr().out
    assert f"{idle}  existing, idle, lost, last seen " in listed
    assert f"{busy}  managed, busy, lost, last seen " in listed and "job train" in listed
    assert "(1 heartbeats), unhealthy, job train" in listed
    assert "    train-a1-n0 [fake/r1]: 8 x NVIDIA H100 80GB HBM3" in listed
    assert "    unhealthy: GPU 0000:A8:00.0 is lost" in listed

    assert cli.main(["workers", "drain", idle]) == 0
    assert "draining: no new reservations" in capsys.readouterr().out
    assert cli.main(["workers", "--state", "idle"]) == 0
    assert "lost, draining" in capsys.readouterr().out
    assert cli.main(["workers", "undrain", idle]) == 0
    assert "not draining" in capsys.readouterr().out

    assert cli.main(["workers", "remove", busy]) == 0
    assert "job train is told at the next liveness sweep" in capsys.readouterr().out
    assert cli.main(["workers"]) == 0
    assert busy not in capsys.readouterr().out  # revoked: listed with --all only
    assert cli.main(["workers", "--all"]) == 0
    assert f"{busy}  managed, revoked" in capsys.readouterr().out
    assert cli.main(["workers", "remove", busy]) == 2
    assert "error: no worker" in capsys.readouterr().err


def test_workers_text_says_when_there_are_none():
    assert workers_text([], utcnow()) == "no workers"


@pytest.fixture
async def api(records: Records) -> AsyncIterator[str]:
    port = free_port()
    async with serving(create_app(records), "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}"


async def test_the_sdk_lists_drains_and_removes_through_the_api(api: str, records: Records):
    idle = register(records, "box-1")
    _, key = Credentials(records.db).create_operator_key("service")

    async with WorkersClient(api, key) as workers:
        [listed] = await workers.list()
        assert (listed.id, listed.liveness, listed.health, listed.draining) == (
            idle,
            "alive",
            "healthy",
            False,
        )
        assert (await workers.drain(idle)).draining
        assert records.reserve_worker(job="j", eligible=lambda _: True) is None
        assert not (await workers.undrain(idle)).draining
        assert (await workers.remove(idle)).state == "revoked"
        assert [w.state for w in await workers.list(state="revoked")] == ["revoked"]
        with pytest.raises(WorkerNotFound):
            await workers.remove(idle)

    async with WorkersClient(api, "gpo_not_a_key") as refused:
        with pytest.raises(GpuprovError, match="answered 401"):
            await refused.list()
    async with WorkersClient(f"http://127.0.0.1:{free_port()}", key) as nowhere:
        with pytest.raises(GpuprovError, match="cannot reach the control-plane API"):
            await nowhere.list()
