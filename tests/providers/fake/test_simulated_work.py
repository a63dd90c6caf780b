"""The fake cloud's simulated agent reads its work the way the real agent does: a reserved node
that asks before its job has written the work gets "none yet" ({}: 204) and asks again, then
runs the assignment once it is there (regression: the empty answer used to end its work loop,
leaving the job waiting on work nobody would start)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import respx

from providers.fake.agent import Lease, Watch, run_work

API = "http://api.test"


async def test_a_none_yet_answer_is_asked_again_and_the_work_then_runs() -> None:
    assignment = {
        "id": "w1",
        "state": "assigned",
        "command": {"run": "echo ran", "env": {}},
        "stop_grace_seconds": 1,
    }
    reads = [httpx.Response(204), httpx.Response(204)]
    exits: list[dict] = []
    ended = asyncio.Event()

    def read_work(request: httpx.Request) -> httpx.Response:
        return reads.pop(0) if reads else httpx.Response(200, json=assignment)

    def exit_reported(request: httpx.Request) -> httpx.Response:
        exits.append(json.loads(request.content))
        ended.set()
        return httpx.Response(204)

    watch = Watch()
    watch.heard({"state": "reserved", "work_id": None})
    with respx.mock(base_url=API, assert_all_called=False) as api:
        api.get("/v1/work").mock(side_effect=read_work)
        api.post("/v1/work/w1/started").mock(return_value=httpx.Response(200, json={}))
        logs = api.post("/v1/work/w1/logs").mock(return_value=httpx.Response(204))
        api.post("/v1/work/w1/exit").mock(side_effect=exit_reported)
        task = asyncio.create_task(run_work(API, "credential", watch))
        try:
            await asyncio.wait_for(ended.wait(), 20)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert not reads, "the empty answers were read first"
    assert exits == [{"code": 0, "tail": "ran\n"}]
    assert logs.called


async def test_work_whose_lease_lapses_is_stopped_and_its_end_marked_lease_lapsed() -> None:
    """The lease rule of the real agent: the API is still reachable and asks for nothing, but
    the node heard no heartbeat answer for its lease: the work gets SIGTERM, and its end is
    reported marked `lease_lapsed`."""
    assignment = {
        "id": "w1",
        "state": "started",
        "command": {"run": "trap 'exit 143' TERM; while :; do sleep 0.05; done", "env": {}},
        "stop_grace_seconds": 5,
    }
    exits: list[dict] = []
    ended = asyncio.Event()

    def exit_reported(request: httpx.Request) -> httpx.Response:
        exits.append(json.loads(request.content))
        ended.set()
        return httpx.Response(204)

    watch = Watch()
    watch.heard({"state": "busy", "work_id": "w1"})
    lease = Lease(time.time(), 1.0)  # its last answered heartbeat: just now, for 1 s
    with respx.mock(base_url=API, assert_all_called=False) as api:
        api.get("/v1/work").mock(return_value=httpx.Response(200, json=assignment))
        api.post("/v1/work/w1/started").mock(return_value=httpx.Response(200, json={}))
        api.post("/v1/work/w1/logs").mock(return_value=httpx.Response(204))
        api.post("/v1/work/w1/exit").mock(side_effect=exit_reported)
        task = asyncio.create_task(run_work(API, "credential", watch, lease=lease))
        try:
            await asyncio.wait_for(ended.wait(), 20)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    [end] = exits
    assert (end["code"], end["lease_lapsed"]) == (143, True)
    assert lease.until is not None and time.time() >= lease.until
