"""A node's work over the real API app (httpx's ASGI transport), on SQLite and PostgreSQL: a
worker reads its assignment and reports its start, output and end; it never reads or changes
another worker's (404, nothing changed); a stop reaches it in the heartbeat's answer; a job's
output is capped, oldest first, with a note; a report wakes the job at once through a real
Temporal dev server."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from gpuprov.api.app import create_app
from gpuprov.config import JobsSettings
from gpuprov.store.credentials import Credentials
from gpuprov.store.db import LogUsage
from gpuprov.store.liveness import Liveness
from gpuprov.store.logs import LogRecords
from gpuprov.store.records import Records
from gpuprov.store.work import Assignment, RunCommand, WorkRecords
from tests.gpuprov.in_process import client_for
from tests.gpuprov.test_api import JOB, REGISTER, body, snapshot, vm_token
from tests.gpuprov.test_auth import bearer

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

JOBS = JobsSettings(stop_grace_seconds=12, log_cap_bytes=1024)
COMMAND = RunCommand(setup="true", run="echo rank $GPUPROV_NODE_RANK", env={"A": "1"})


@pytest.fixture
def app(records: Records) -> FastAPI:
    return create_app(records, jobs=JOBS)


async def register(api: httpx.AsyncClient, records: Records, node: int, job: str = JOB) -> dict:
    token = vm_token(records, vm=f"{job}-a1-n{node}", job=job)
    answer = await api.post(REGISTER, json=body(token))
    assert answer.status_code == 200, answer.text
    return {**answer.json(), "headers": bearer(answer.json()["credential"])}


@pytest.fixture
async def nodes(api: httpx.AsyncClient, records: Records) -> list[dict]:
    """Two managed workers of JOB, each given its rank's work of epoch 0."""
    workers = [await register(api, records, node) for node in range(2)]
    WorkRecords(records.db).assign(
        JOB,
        0,
        [
            Assignment(rank=rank, worker_id=worker["worker_id"], command=COMMAND)
            for rank, worker in enumerate(workers)
        ],
    )
    for worker in workers:
        answer = await api.get("/v1/work", headers=worker["headers"])
        assert answer.status_code == 200, answer.text
        worker["work"] = answer.json()
    return workers


async def test_a_worker_reads_its_work_reports_it_and_is_stamped_changed(
    api: httpx.AsyncClient, records: Records, nodes: list[dict]
):
    first = nodes[0]
    work, headers = first["work"], first["headers"]
    assert {key: work[key] for key in ("job", "epoch", "rank", "state")} == {
        "job": JOB,
        "epoch": 0,
        "rank": 0,
        "state": "assigned",
    }
    assert work["command"] == COMMAND.model_dump() and work["stop_grace_seconds"] == 12
    worker_id = first["worker_id"]
    assert records.get_worker(worker_id).changed_at is None

    started = await api.post(f"/v1/work/{work['id']}/started", headers=headers)
    assert started.status_code == 200, started.text
    assert started.json() == {"id": work["id"], "state": "started", "changed": True}
    assert records.get_worker(worker_id).changed_at is None  # a start wakes nobody
    again = await api.post(f"/v1/work/{work['id']}/started", headers=headers)
    assert again.json() == {"id": work["id"], "state": "started", "changed": False}

    chunk = {"seq": 0, "stream": "stdout", "data": "rank 0\n"}
    assert (await api.post(f"/v1/work/{work['id']}/logs", json=chunk, headers=headers)).json() == {
        "stored": True
    }
    repeat = await api.post(f"/v1/work/{work['id']}/logs", json=chunk, headers=headers)
    assert repeat.json() == {"stored": False}

    ended = await api.post(
        f"/v1/work/{work['id']}/exit", json={"code": 0, "tail": "rank 0\n"}, headers=headers
    )
    assert ended.json() == {"id": work["id"], "state": "exited", "changed": True}
    stamped = records.get_worker(worker_id).changed_at
    assert stamped is not None  # the liveness sweep wakes the job
    assert (await api.get("/v1/work", headers=headers)).status_code == 204
    [mine, _] = WorkRecords(records.db).of_job(JOB, 0)
    assert (mine.state.value, mine.exit_code, mine.tail) == ("exited", 0, "rank 0\n")
    repeated = await api.post(
        f"/v1/work/{work['id']}/exit", json={"code": 3, "tail": "late"}, headers=headers
    )
    assert repeated.json() == {"id": work["id"], "state": "exited", "changed": False}
    assert records.get_worker(worker_id).changed_at == stamped  # a repeat changes nothing


async def test_a_worker_cannot_read_or_report_another_workers_work(
    api: httpx.AsyncClient, records: Records, nodes: list[dict]
):
    mine, theirs = nodes
    assert mine["work"]["id"] != theirs["work"]["id"]
    before = snapshot(records)
    target = theirs["work"]["id"]
    for path, payload in (
        ("started", None),
        ("exit", {"code": 0}),
        ("logs", {"seq": 0, "stream": "stdout", "data": "not mine\n"}),
    ):
        refused = await api.post(f"/v1/work/{target}/{path}", json=payload, headers=mine["headers"])
        assert refused.status_code == 404, refused.text
        anonymous = await api.post(f"/v1/work/{target}/{path}", json=payload)
        assert anonymous.status_code == 401, anonymous.text
        forged = await api.post(
            f"/v1/work/{target}/{path}", json=payload, headers=bearer("gpw_" + "x" * 60)
        )
        assert forged.status_code == 401, forged.text
    assert (await api.get("/v1/work")).status_code == 401
    assert (await api.get("/v1/work", headers=mine["headers"])).json()["id"] == mine["work"]["id"]
    assert snapshot(records) == before


async def test_a_revoked_worker_reads_and_reports_nothing(
    api: httpx.AsyncClient, records: Records, nodes: list[dict]
):
    mine = nodes[0]
    operator = bearer(Credentials(records.db).create_operator_key("ops")[1])
    assert (await api.delete(f"/v1/workers/{mine['worker_id']}", headers=operator)).is_success
    before = snapshot(records)
    work_id = mine["work"]["id"]
    assert (await api.get("/v1/work", headers=mine["headers"])).status_code == 401
    for path in ("started", "exit", "logs"):
        payload = {"code": 0, "seq": 0, "stream": "stdout", "data": "x"}
        answer = await api.post(f"/v1/work/{work_id}/{path}", json=payload, headers=mine["headers"])
        assert answer.status_code == 401, answer.text
    assert snapshot(records) == before


async def test_work_stopped_before_it_started_must_not_start(
    api: httpx.AsyncClient, records: Records, nodes: list[dict]
):
    work = WorkRecords(records.db)
    assert work.request_stop(JOB, 0) == 2  # nobody started: both stopped at once
    mine = nodes[0]
    refused = await api.post(f"/v1/work/{mine['work']['id']}/started", headers=mine["headers"])
    assert refused.status_code == 409, refused.text
    assert "stopped" in refused.json()["detail"]
    assert (await api.get("/v1/work", headers=mine["headers"])).status_code == 204


async def test_a_stop_reaches_the_node_in_its_heartbeat_answer(
    api: httpx.AsyncClient, records: Records, nodes: list[dict]
):
    mine = nodes[0]
    work_id, headers = mine["work"]["id"], mine["headers"]
    await api.post(f"/v1/work/{work_id}/started", headers=headers)
    beat = await api.post("/v1/workers/heartbeat", json={"healthy": True}, headers=headers)
    assert (beat.json()["work_id"], beat.json()["stop_requested"]) == (work_id, False)

    WorkRecords(records.db).request_stop(JOB, 0)

    beat = await api.post("/v1/workers/heartbeat", json={"healthy": True}, headers=headers)
    assert (beat.json()["work_id"], beat.json()["stop_requested"]) == (work_id, True)
    assert (await api.get("/v1/work", headers=headers)).json()["state"] == "stop_requested"
    ended = await api.post(f"/v1/work/{work_id}/exit", json={"code": -15}, headers=headers)
    assert ended.json()["state"] == "stopped"
    beat = await api.post("/v1/workers/heartbeat", json={"healthy": True}, headers=headers)
    assert (beat.json()["work_id"], beat.json()["stop_requested"]) == (None, False)


async def test_abandoned_work_neither_starts_nor_changes(
    api: httpx.AsyncClient, records: Records, nodes: list[dict]
):
    mine = nodes[0]
    WorkRecords(records.db).abandon(JOB, 0)
    work_id, headers = mine["work"]["id"], mine["headers"]
    assert (await api.post(f"/v1/work/{work_id}/started", headers=headers)).status_code == 409
    late = await api.post(f"/v1/work/{work_id}/exit", json={"code": 0}, headers=headers)
    assert late.json() == {"id": work_id, "state": "abandoned", "changed": False}


async def test_the_log_cap_drops_the_oldest_output_with_a_note(
    api: httpx.AsyncClient, records: Records, nodes: list[dict]
):
    operator = bearer(Credentials(records.db).create_operator_key("ops")[1])
    lines = [f"{index:03d} {'x' * 295}\n" for index in range(10)]  # 300 bytes each
    for index, line in enumerate(lines):  # the two nodes take turns
        node = nodes[index % 2]
        chunk = {"seq": index // 2, "stream": "stdout", "data": line}
        stored = await api.post(
            f"/v1/work/{node['work']['id']}/logs", json=chunk, headers=node["headers"]
        )
        assert stored.json() == {"stored": True}, stored.text

    page = await api.get(f"/v1/jobs/{JOB}/logs", headers=operator)
    assert page.status_code == 200, page.text
    chunks = page.json()["chunks"]
    output = [chunk["data"] for chunk in chunks if chunk["stream"] == "stdout"]
    assert output == [lines[7], lines[8], lines[9]]  # the newest that fit in 1024 bytes
    [note] = [chunk for chunk in chunks if chunk["stream"] == "gpuprov"]
    assert note["data"].startswith("2100 bytes of this job's oldest output were dropped")
    assert "1024 bytes ([jobs] log_cap_bytes)" in note["data"]
    with records.db.session() as session:
        usage = session.get(LogUsage, (JOB, ""))  # work assigned without a run
    assert (usage.kept_bytes, usage.dropped_bytes) == (900, 2100)

    one_node = (await api.get(f"/v1/jobs/{JOB}/logs", params={"node": 1}, headers=operator)).json()
    assert [(chunk["stream"], chunk["data"]) for chunk in one_node["chunks"]] == [
        ("stdout", lines[7]),
        ("stdout", lines[9]),
        ("gpuprov", note["data"]),  # the control plane's notes come with every node's output
    ]
    later = await api.get(
        f"/v1/jobs/{JOB}/logs", params={"after": chunks[-1]["id"]}, headers=operator
    )
    assert later.json() == {"chunks": [], "next_after": chunks[-1]["id"], "run": ""}
    assert (await api.get(f"/v1/jobs/{JOB}/logs", headers=nodes[0]["headers"])).status_code == 401


async def test_a_log_cursor_past_any_chunks_id_is_422_naming_after(
    api: httpx.AsyncClient, records: Records
):
    operator = bearer(Credentials(records.db).create_operator_key("ops")[1])
    path = f"/v1/jobs/{JOB}/logs"
    largest = await api.get(path, params={"after": 2**31 - 1}, headers=operator)
    assert largest.json() == {"chunks": [], "next_after": 2**31 - 1, "run": ""}, largest.text
    for after in (2**31, 2**63, 10**30):
        refused = await api.get(path, params={"after": after}, headers=operator)
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["loc"] == ["query", "after"]


async def test_output_any_database_can_store(
    api: httpx.AsyncClient, records: Records, nodes: list[dict]
):
    """A NUL (JSON carries it; PostgreSQL's text does not) is stored as U+FFFD; a lone
    surrogate (no UTF-8 for it) is refused with nothing stored."""
    node = nodes[0]
    path = f"/v1/work/{node['work']['id']}/logs"
    headers = {**node["headers"], "Content-Type": "application/json"}
    chunk = '{"seq": 0, "stream": "stderr", "data": "a\\u0000b \\u2713\\n"}'
    answer = await api.post(path, content=chunk, headers=headers)
    assert answer.json() == {"stored": True}, answer.text
    [stored] = LogRecords(records.db).chunks(JOB).chunks
    assert stored.data == "a\ufffdb ✓\n"
    before = snapshot(records)
    surrogate = '{"seq": 1, "stream": "stderr", "data": "a\\ud800"}'
    assert (await api.post(path, content=surrogate, headers=headers)).status_code == 422
    assert snapshot(records) == before


# ---------------------------------------------------------------- the job is woken at once


@workflow.defn(name="WakeRecorder")
class WakeRecorder:
    """Stands in for a job: ends once it is sent workers_changed."""

    def __init__(self) -> None:
        self.woken = False

    @workflow.signal(name="workers_changed")
    def workers_changed(self) -> None:
        self.woken = True

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.woken)
        return "woken"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # not about the database
@pytest.mark.parametrize("given", ["client", "connect when first needed"])
async def test_a_report_wakes_the_job_at_once_and_the_sweep_has_nothing_left(
    client: Client, task_queue: str, records: Records, job_name: str, given: str
):
    connections: list[Client] = []

    async def connect() -> Client:  # as `gpuprov api` passes connect_temporal
        connections.append(client)
        return client

    app = create_app(records, jobs=JOBS, temporal=client if given == "client" else connect)
    async with (
        client_for(app) as api,
        Worker(
            client,
            task_queue=task_queue,
            workflows=[WakeRecorder],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ),
    ):
        worker = await register(api, records, 0, job=job_name)
        WorkRecords(records.db).assign(
            job_name, 0, [Assignment(rank=0, worker_id=worker["worker_id"], command=COMMAND)]
        )
        handle = await client.start_workflow(
            WakeRecorder.run,
            id=f"job-{job_name}",
            task_queue=task_queue,
            execution_timeout=timedelta(minutes=1),
        )
        work_id = (await api.get("/v1/work", headers=worker["headers"])).json()["id"]
        started = await api.post(f"/v1/work/{work_id}/started", headers=worker["headers"])
        assert started.status_code == 200, started.text
        assert records.get_worker(worker["worker_id"]).changed_at is None  # a start wakes nobody
        ended = await api.post(
            f"/v1/work/{work_id}/exit", headers=worker["headers"], json={"code": 0, "tail": ""}
        )
        assert ended.status_code == 200, ended.text
        assert await asyncio.wait_for(handle.result(), 30) == "woken"
        row = records.get_worker(worker["worker_id"])
        assert row.changed_at is not None and row.notified_at == row.changed_at
        assert Liveness(records.db).pending() == []
        assert len(connections) == (0 if given == "client" else 1)


async def unreachable() -> Client:
    raise RuntimeError("Failed client connect: Connection refused")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("temporal", [None, unreachable], ids=["none", "unreachable"])
async def test_without_temporal_a_report_still_counts_and_the_sweep_tells_the_job(
    records: Records, temporal
):
    app = create_app(records, jobs=JOBS, temporal=temporal)
    async with client_for(app) as api:
        node = await register(api, records, 0)
        WorkRecords(records.db).assign(
            JOB, 0, [Assignment(rank=0, worker_id=node["worker_id"], command=COMMAND)]
        )
        work_id = (await api.get("/v1/work", headers=node["headers"])).json()["id"]
        started = await api.post(f"/v1/work/{work_id}/started", headers=node["headers"])
        ended = await api.post(
            f"/v1/work/{work_id}/exit", headers=node["headers"], json={"code": 0, "tail": ""}
        )
    assert started.json() == {"id": work_id, "state": "started", "changed": True}
    assert ended.json() == {"id": work_id, "state": "exited", "changed": True}
    row = records.get_worker(node["worker_id"])
    assert row.changed_at is not None and row.notified_at is None
    assert [worker.id for worker in Liveness(records.db).pending()] == [node["worker_id"]]
