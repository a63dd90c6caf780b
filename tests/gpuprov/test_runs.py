"""Runs of one job name in the database, on SQLite and PostgreSQL: each run's work, output,
costs and worker reservations are its own; readers show the latest run and an earlier one on
request (the API's log and cost routes included); an unknown run is refused."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI

from gpuprov.api.app import create_app
from gpuprov.models import WorkState
from gpuprov.store.costs import cost_report
from gpuprov.store.credentials import Credentials
from gpuprov.store.liveness import Liveness
from gpuprov.store.logs import LogRecords
from gpuprov.store.records import Records
from gpuprov.store.runs import RunNotFound, latest_run, run_of_vm, runs_of
from gpuprov.store.work import Assignment, RunCommand, WorkRecords
from tests.gpuprov.test_api import CAPABILITIES, REGISTER, body
from tests.gpuprov.test_auth import bearer
from tests.gpuprov.test_heartbeats_api import HEARTBEAT

JOB = "train"
FIRST, SECOND = "aaaaa1", "bbbbb2"  # run tags, as vm_run_tag makes them
COMMAND = RunCommand(run="true")
QUOTE = dict(kind="estimate", amount=10.0, currency="USD", unit="hour", source="test")


@pytest.fixture
def app(records: Records) -> FastAPI:
    return create_app(records)


def vm(run: str, node: int = 0) -> str:
    return f"{JOB}-a1-n{node}-{run}"


async def managed_worker(api: httpx.AsyncClient, records: Records, run: str) -> dict:
    """A node of `run`'s machine, registered through the API."""
    records.record_vm(
        job=JOB, node_index=0, attempt=1, vm=vm(run), provider="fake", region="r1", zone=None
    )
    token = records.mint_token(vm=vm(run), ttl=timedelta(minutes=5))
    answer = await api.post(REGISTER, json=body(token))
    assert answer.status_code == 200, answer.text
    return {**answer.json(), "headers": bearer(answer.json()["credential"])}


async def test_each_run_reads_and_stops_only_its_own_work(api, records: Records):
    work = WorkRecords(records.db)
    first = await managed_worker(api, records, FIRST)
    second = await managed_worker(api, records, SECOND)
    work.assign(JOB, 0, [Assignment(rank=0, worker_id=first["worker_id"], command=COMMAND)], FIRST)
    work.request_stop(JOB, 0, FIRST)  # never started: stopped at once
    work.assign(
        JOB, 0, [Assignment(rank=0, worker_id=second["worker_id"], command=COMMAND)], SECOND
    )

    [old] = work.of_job(JOB, 0, FIRST)
    [new] = work.of_job(JOB, 0, SECOND)
    assert (old.worker_id, old.state) == (first["worker_id"], WorkState.STOPPED)
    assert (new.worker_id, new.state) == (second["worker_id"], WorkState.ASSIGNED)
    assert work.abandon(JOB, 0, FIRST) == 0  # nothing of the first run is unfinished
    assert [w.state for w in work.of_job(JOB, 0, SECOND)] == [WorkState.ASSIGNED]
    assert [run.run for run in runs_of(records.db, JOB)] == [FIRST, SECOND]
    assert latest_run(records.db, JOB) == SECOND


async def test_a_joined_worker_gets_only_the_work_of_the_run_it_is_reserved_for(
    api, records: Records
):
    """An earlier run left an unfinished row (at a later epoch) on an existing worker: once the
    worker is reserved for the next run, that row is never its work again."""
    work = WorkRecords(records.db)
    token = records.mint_token(label="box", ttl=timedelta(minutes=5))
    joined = await api.post(REGISTER, json={"token": token, "capabilities": CAPABILITIES})
    box = {**joined.json(), "headers": bearer(joined.json()["credential"])}
    box_id = box["worker_id"]

    def assign(run: str, epoch: int) -> None:
        work.assign(JOB, epoch, [Assignment(rank=0, worker_id=box_id, command=COMMAND)], run)

    assert records.reserve_worker(job=JOB, eligible=lambda _: True, run=FIRST) is not None
    assign(FIRST, 2)
    records.release_job_workers(JOB, FIRST)  # its row is left "assigned"
    assert work.for_worker(box_id) is None  # an idle worker has no work
    assert records.reserve_worker(job=JOB, eligible=lambda _: True, run=SECOND) is not None
    assert work.for_worker(box_id) is None  # the next run has given it none yet
    assert (await api.get("/v1/work", headers=box["headers"])).status_code == 204
    heartbeat = await api.post(HEARTBEAT, json={"healthy": True}, headers=box["headers"])
    assert heartbeat.json().get("work_id") is None, heartbeat.text
    assign(SECOND, 0)
    current = work.for_worker(box_id)
    assert current is not None and (current.run, current.epoch) == (SECOND, 0)
    answer = await api.get("/v1/work", headers=box["headers"])
    assert answer.json()["id"] == current.id
    heartbeat = await api.post(HEARTBEAT, json={"healthy": True}, headers=box["headers"])
    assert heartbeat.json()["work_id"] == current.id


async def test_each_runs_output_is_read_and_capped_on_its_own(api, records: Records):
    work, logs = WorkRecords(records.db), LogRecords(records.db)
    rows = {}
    for run in (FIRST, SECOND):
        node = await managed_worker(api, records, run)
        work.assign(JOB, 0, [Assignment(rank=0, worker_id=node["worker_id"], command=COMMAND)], run)
        rows[run] = work.for_worker(node["worker_id"])
    assert logs.append(rows[FIRST], 0, "stdout", "first run\n", cap=64)
    for seq in range(4):  # 4 x 30 bytes: past the cap of 64, the second run's oldest go
        assert logs.append(rows[SECOND], seq, "stdout", f"{seq}" * 29 + "\n", cap=64)

    first = [c.data for c in logs.chunks(JOB, run=FIRST).chunks]
    second = [(c.stream, c.data) for c in logs.chunks(JOB, run=SECOND).chunks]
    assert first == ["first run\n"]  # the cap of another run never drops it
    assert [data for stream, data in second if stream == "stdout"] == [
        "2" * 29 + "\n",
        "3" * 29 + "\n",
    ]
    assert [data for stream, data in second if stream == "gpuprov"][0].startswith("60 bytes")


async def test_the_log_and_cost_routes_show_the_latest_run_and_an_earlier_one_on_request(
    api, records: Records
):
    work, logs = WorkRecords(records.db), LogRecords(records.db)
    for run in (FIRST, SECOND):
        node = await managed_worker(api, records, run)
        records.record_cost(job=JOB, provider="fake", run=run, **QUOTE)
        work.assign(JOB, 0, [Assignment(rank=0, worker_id=node["worker_id"], command=COMMAND)], run)
        logs.append(work.for_worker(node["worker_id"]), 0, "stdout", f"{run}\n", cap=64)
    operator = bearer(Credentials(records.db).create_operator_key("ops")[1])

    async def read(path: str, **params: str) -> dict:
        answer = await api.get(path, params=params, headers=operator)
        assert answer.status_code == 200, answer.text
        return answer.json()

    latest, earlier = (
        await read(f"/v1/jobs/{JOB}/logs"),
        await read(f"/v1/jobs/{JOB}/logs", run=FIRST),
    )
    assert (latest["run"], [c["data"] for c in latest["chunks"]]) == (SECOND, [f"{SECOND}\n"])
    assert (earlier["run"], [c["data"] for c in earlier["chunks"]]) == (FIRST, [f"{FIRST}\n"])
    cost, old_cost = await read("/v1/cost", job=JOB), await read("/v1/cost", job=JOB, run=FIRST)
    assert (cost["run"], [m["vm"] for m in cost["machines"]]) == (SECOND, [vm(SECOND)])
    assert (old_cost["run"], [m["vm"] for m in old_cost["machines"]]) == (FIRST, [vm(FIRST)])
    assert cost["runs"] == [FIRST, SECOND]
    for path, params in ((f"/v1/jobs/{JOB}/logs", {}), ("/v1/cost", {"job": JOB})):
        unknown = await api.get(path, params={**params, "run": "cccccc"}, headers=operator)
        assert unknown.status_code == 404, unknown.text
    with pytest.raises(RunNotFound):
        cost_report(records.db, JOB, "cccccc")


async def test_releasing_a_run_frees_only_that_runs_workers(api, records: Records):
    old = await managed_worker(api, records, FIRST)
    records.release_job_workers(JOB, FIRST)
    box = records.mint_token(label="box", ttl=timedelta(minutes=5))
    joined = await api.post(REGISTER, json={"token": box, "capabilities": CAPABILITIES})
    box_id = joined.json()["worker_id"]
    reserved = records.reserve_worker(job=JOB, eligible=lambda _: True, run=SECOND)
    assert reserved is not None and reserved.run == SECOND

    assert records.release_job_workers(JOB, FIRST) == []  # a repeat for the first run
    assert records.get_worker(box_id).state == "reserved"
    liveness = Liveness(records.db)
    assert [w.id for w in liveness.of_job(JOB, SECOND)] == [box_id]
    assert [w.id for w in liveness.of_job(JOB, FIRST)] == [old["worker_id"]]
    [freed] = records.release_job_workers(JOB, SECOND)
    assert (freed.id, freed.state, freed.job, freed.run) == (box_id, "idle", None, "")


def test_a_run_is_told_by_the_end_of_its_vm_identities():
    assert run_of_vm("train-7b-a2-n0-ce4389") == "ce4389"
    assert run_of_vm("train-7b-a2-n0") == ""  # an identity from before run tags
    assert run_of_vm("box-ce4389") == ""
