"""Heartbeats and the operator's drain/undrain/remove over the real API app (httpx's ASGI
transport), on SQLite and PostgreSQL. A refused call leaves every table as it was."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from gpuprov.api.app import create_app
from gpuprov.config import WorkersSettings
from gpuprov.store.credentials import Credentials
from gpuprov.store.records import Records
from tests.gpuprov.test_api import snapshot
from tests.gpuprov.test_auth import bearer, register_worker

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

HEARTBEAT = "/v1/workers/heartbeat"
SETTINGS = WorkersSettings(heartbeat_interval_seconds=7.5, lost_after_seconds=20)


@pytest.fixture
def app(records: Records) -> FastAPI:
    return create_app(records, workers=SETTINGS)


@pytest.fixture
def operator(records: Records) -> dict[str, str]:
    _, key = Credentials(records.db).create_operator_key("ops")
    return bearer(key)


async def test_a_heartbeat_is_recorded_and_answers_the_interval(
    api: httpx.AsyncClient, records: Records
):
    worker = await register_worker(api, records, managed=True)
    credential = bearer(worker["credential"])

    beat = await api.post(HEARTBEAT, json={"healthy": True}, headers=credential)

    assert beat.status_code == 200, beat.text
    assert beat.json() == {
        "interval_seconds": 7.5,
        "lease_seconds": 20.0,  # lease_seconds unset: lost_after_seconds
        "draining": False,
        "state": "reserved",
        "work_id": None,  # no work given to it yet
        "stop_requested": False,
    }
    row = records.get_worker(worker["worker_id"])
    assert row is not None and row.heartbeats == 1 and row.changed_at is None
    assert row.last_seen_at is not None and row.work_ends_by is not None
    # it keeps its work for at most the lease (20 s) and the stop grace period (30 s)
    assert (row.work_ends_by - row.last_seen_at).total_seconds() == 50
    detail = "GPU 00000000:A8:00.0 is lost (fallen off the bus, Xid 79)"
    sick = await api.post(HEARTBEAT, json={"healthy": False, "detail": detail}, headers=credential)
    assert sick.status_code == 200, sick.text
    row = records.get_worker(worker["worker_id"])
    assert row is not None and (row.heartbeats, row.health, row.health_detail) == (
        2,
        "unhealthy",
        detail,
    )
    assert row.changed_at == row.last_seen_at
    me = await api.get("/v1/workers/me", headers=credential)
    assert (me.json()["health"], me.json()["heartbeats"], me.json()["liveness"]) == (
        "unhealthy",
        2,
        "alive",
    )


async def test_a_revoked_workers_heartbeat_is_refused_with_nothing_changed(
    api: httpx.AsyncClient, records: Records, operator: dict[str, str]
):
    worker = await register_worker(api, records, managed=False)
    credential = bearer(worker["credential"])
    removed = await api.delete(f"/v1/workers/{worker['worker_id']}", headers=operator)
    assert removed.status_code == 200, removed.text
    assert removed.json()["state"] == "revoked"
    before = snapshot(records)

    for body in ({"healthy": True}, {"healthy": False, "detail": "x"}):
        refused = await api.post(HEARTBEAT, json=body, headers=credential)
        assert refused.status_code == 401, refused.text
        assert refused.headers["www-authenticate"] == "Bearer"

    assert snapshot(records) == before


@pytest.mark.parametrize(
    "body",
    [{}, {"healthy": "maybe"}, {"healthy": True, "detail": "x" * 501}, {"healthy": True, "z": 1}],
)
async def test_a_bad_heartbeat_is_422_and_writes_nothing(
    api: httpx.AsyncClient, records: Records, body: dict
):
    worker = await register_worker(api, records, managed=True)
    before = snapshot(records)

    refused = await api.post(HEARTBEAT, json=body, headers=bearer(worker["credential"]))

    assert refused.status_code == 422, refused.text
    assert snapshot(records) == before


async def test_drain_is_answered_to_the_agent_and_undrain_takes_it_back(
    api: httpx.AsyncClient, records: Records, operator: dict[str, str]
):
    worker = await register_worker(api, records, managed=False)
    credential, path = bearer(worker["credential"]), f"/v1/workers/{worker['worker_id']}"

    drained = await api.post(f"{path}/drain", headers=operator)

    assert drained.status_code == 200 and drained.json()["draining"] is True, drained.text
    beat = await api.post(HEARTBEAT, json={"healthy": True}, headers=credential)
    assert beat.json()["draining"] is True
    assert records.reserve_worker(job="j", eligible=lambda _: True) is None
    listed = await api.get("/v1/workers", headers=operator)
    assert [row["draining"] for row in listed.json()["workers"]] == [True]

    undrained = await api.post(f"{path}/undrain", headers=operator)
    assert undrained.json()["draining"] is False
    beat = await api.post(HEARTBEAT, json={"healthy": True}, headers=credential)
    assert beat.json()["draining"] is False


async def test_operator_actions_on_an_unknown_worker_are_404_and_change_nothing(
    api: httpx.AsyncClient, records: Records, operator: dict[str, str]
):
    await register_worker(api, records, managed=False)
    before = snapshot(records)
    for method, path in (
        ("POST", "/v1/workers/nobody/drain"),
        ("POST", "/v1/workers/nobody/undrain"),
        ("DELETE", "/v1/workers/nobody"),
    ):
        response = await api.request(method, path, headers=operator)
        assert response.status_code == 404, (path, response.text)
    assert snapshot(records) == before


async def test_heartbeats_that_come_together_share_a_batch_and_a_revoked_one_is_refused_alone(
    app: FastAPI,
    api: httpx.AsyncClient,
    records: Records,
    operator: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
):
    workers = [await register_worker(api, records, managed=False) for _ in range(4)]
    gone = workers.pop()
    assert (await api.delete(f"/v1/workers/{gone['worker_id']}", headers=operator)).is_success
    batched: list[int] = []
    liveness = app.state.liveness
    record_batch = liveness.heartbeats

    def counted(beats, **kwargs):  # the real write, its batch sizes noted
        batched.append(len(beats))
        return record_batch(beats, **kwargs)

    monkeypatch.setattr(liveness, "heartbeats", counted)
    answers = await asyncio.gather(
        *(
            api.post(HEARTBEAT, json={"healthy": True}, headers=bearer(w["credential"]))
            for w in [*workers, gone]
        )
    )
    assert [answer.status_code for answer in answers] == [200, 200, 200, 401]
    assert batched[0] == 4  # all four in one transaction; the refused one again via the route
    for worker in workers:
        row = records.get_worker(worker["worker_id"])
        assert row is not None and row.heartbeats == 1 and row.liveness == "alive"
    row = records.get_worker(gone["worker_id"])
    assert row is not None and row.heartbeats == 0


async def test_the_fast_path_and_the_route_answer_a_heartbeat_alike(
    api: httpx.AsyncClient, records: Records
):
    worker = await register_worker(api, records, managed=True)
    credential = bearer(worker["credential"]) | {"Content-Type": "application/json"}
    body = b'{"healthy": true, "detail": null}'

    fast = await api.post(HEARTBEAT, content=body, headers=credential)

    async def chunked():  # no Content-Length: the framework's route answers it
        yield body

    routed = await api.post(HEARTBEAT, content=chunked(), headers=credential)
    assert (fast.status_code, routed.status_code) == (200, 200), routed.text
    assert fast.json() == routed.json()
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    row = records.get_worker(worker["worker_id"])
    assert row is not None and row.heartbeats == 2
    # What the fast path does not take, the route refuses as it refuses any request.
    bad = await api.post(HEARTBEAT, json={"healthy": "maybe"}, headers=credential)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "healthy"]
    assert (await api.post(HEARTBEAT, json={"healthy": True})).status_code == 401
