"""A reserved node's long poll for its work (gpuprov/api/work_waits.py), over the real API on
SQLite and PostgreSQL: the read is held until the work is written and answered then, not at
the end of its wait; with none it is 204 once the wait is over; a process holding too many is
429 with Retry-After; a shutdown ends every held read at once. And the agent's side
(gpuprov/node/work_runner.py): a reserved node with no work named long-polls, begins the next
poll at once after a held one, and never spins on an API that answers at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.node import work_runner
from gpuprov.node.work_runner import WORK_HTTP_TIMEOUT, WorkRunner
from gpuprov.store.records import Records
from gpuprov.store.work import Assignment, WorkRecords
from tests.gpuprov.test_work_api import COMMAND, JOB, register

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

WAIT = 20.0  # what each long poll asks for: far above how soon the work is answered


@pytest.fixture
def app(records: Records) -> FastAPI:
    return create_app(records)


def assign(records: Records, worker_id: str, rank: int = 0) -> None:
    WorkRecords(records.db).assign(
        JOB, 0, [Assignment(rank=rank, worker_id=worker_id, command=COMMAND)]
    )


async def test_a_held_read_is_answered_once_the_work_is_written(
    api: httpx.AsyncClient, records: Records
) -> None:
    nodes = [await register(api, records, node) for node in range(3)]
    polls = [
        asyncio.create_task(api.get(f"/v1/work?wait={WAIT:g}", headers=node["headers"]))
        for node in nodes
    ]
    await asyncio.sleep(0.5)
    assert not any(poll.done() for poll in polls)  # held: nothing to answer yet
    began = time.monotonic()
    for rank, node in enumerate(nodes[:2]):
        assign(records, node["worker_id"], rank)
    answers = await asyncio.gather(*polls[:2])
    answered_after = time.monotonic() - began
    assert [answer.status_code for answer in answers] == [200, 200]
    assert {answer.json()["rank"] for answer in answers} == {0, 1}
    assert answered_after < WAIT / 2, answered_after  # at the write, not at the wait's end
    assert not polls[2].done()  # the third node's work was not written: still held
    polls[2].cancel()


async def test_with_no_work_the_wait_ends_in_204_and_a_full_process_says_429(
    records: Records,
) -> None:
    app = create_app(records)
    app.state.work_waits.max_waiters = 1
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as api:
        first, second = [await register(api, records, node) for node in range(2)]
        began = time.monotonic()
        held = asyncio.create_task(api.get("/v1/work?wait=1", headers=first["headers"]))
        await asyncio.sleep(0.2)
        busy = await api.get(f"/v1/work?wait={WAIT:g}", headers=second["headers"])
        assert busy.status_code == 429 and int(busy.headers["retry-after"]) > 0
        empty = await held
        assert empty.status_code == 204 and time.monotonic() - began >= 1.0
        too_long = await api.get("/v1/work?wait=31", headers=first["headers"])
        assert too_long.status_code == 422
    assert app.state.work_waits.waiting == 0


async def test_a_shutdown_ends_every_held_read_at_once(records: Records) -> None:
    app = create_app(records)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=60) as api:
        async with serving(app, "127.0.0.1", port):
            node = await register(api, records, 0)
            held = asyncio.create_task(api.get("/v1/work?wait=30", headers=node["headers"]))
            await asyncio.sleep(0.5)
            stopping = time.monotonic()
        stopped_after = time.monotonic() - stopping
        answer = await held
    assert answer.status_code == 204
    assert stopped_after < 15, stopped_after  # not held up by the 30 s wait
    # Served again, the same app holds reads again.
    async with serving(app, "127.0.0.1", port), httpx.AsyncClient(base_url=url) as api:
        again = asyncio.create_task(api.get("/v1/work?wait=1", headers=node["headers"]))
        await asyncio.sleep(0.3)
        assert not again.done()
        assert (await again).status_code == 204


def test_the_agent_long_polls_while_reserved_and_never_spins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_poll = 1.0  # the agent's LONG_POLL, made short for the test
    monkeypatch.setattr(work_runner, "LONG_POLL", long_poll)
    calls: list[tuple[str, float | None]] = []
    delay = {"seconds": 0.0}

    def call(path: str, body: dict | None, what: str, timeout: float | None = None) -> dict:
        calls.append((path, timeout))
        time.sleep(delay["seconds"])
        return {}

    runner = WorkRunner(call, str(tmp_path))
    runner.heard({"state": "reserved", "lease_seconds": 60.0}, 1.0, sent_at=time.monotonic())
    runner._step()
    assert calls == [(f"/v1/work?wait={long_poll:g}", pytest.approx(long_poll + WORK_HTTP_TIMEOUT))]
    # An API that answers at once (no long polls there): asked again only after the pause.
    assert not runner.again and runner.next_poll > time.monotonic()
    runner._step()
    assert len(calls) == 1
    # A read the API held (here: as long as long_poll / 2): the next begins at once.
    runner.next_poll, delay["seconds"] = 0.0, long_poll / 2
    runner._step()
    assert runner.again and len(calls) == 2
    # A heartbeat that names the work: a plain read, not a held one.
    runner.heard({"state": "reserved", "work_id": "w1", "lease_seconds": 60.0}, 1.0,
                 sent_at=time.monotonic())  # fmt: skip
    delay["seconds"] = 0.0
    runner._step()
    assert calls[-1][0] == "/v1/work"
