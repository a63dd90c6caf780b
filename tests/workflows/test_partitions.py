"""Recovery that is fenced, and never fooled by a blip, with the real node agent on the fake
cloud, the real API and the dev server, and a link between the agents and the API that the test
degrades (tests/link.py). The liveness sweep runs every second, as its Schedule would.

- A node cut off from the API while its delete fails: its work stops once its lease and grace
  period are over, the new attempt's work starts only after that, and the timestamps the work
  itself writes never overlap.
- A link that delays every heartbeat and drops a share of them, for a long run: no restart.
- The same link cut for good: exactly one restart."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.config import FaultRule
from gpuprov.contract import WatchInput
from gpuprov.models import JobState
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from providers.errors import ErrorKind
from providers.fake import FakeCloud
from tests import link as links
from tests.helpers import OFFER_A, OFFER_B, assert_nothing_left, fake_worker, fast_cloud, job, until
from tests.workflows.test_work_on_nodes import FAST, JOBS, sqlite_records
from workflows.liveness import WatchWorkers

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

__all__ = ["sqlite_records"]  # the fixture, shared


@asynccontextmanager
async def linked_nodes(
    client: Client, task_queue: str, records: Records, *faults: FaultRule, seed: int = 0
) -> AsyncIterator[tuple[GpuprovClient, FakeCloud, links.Link]]:
    """The API on a free port behind a Link, a worker whose fake cloud boots the real agent
    on every instance (talking to the API through the link), and the liveness sweep."""
    port = free_port()
    app = create_app(records, workers=FAST, jobs=JOBS, temporal=client)
    async with serving(app, "127.0.0.1", port), links.running(port, seed) as link:
        config = fast_cloud(list(faults), agent="real", boot_timeout=60)
        async with fake_worker(client, task_queue, config, records, api_url=link.url) as pair:
            sweeps = asyncio.create_task(sweep_every_second(client, task_queue))
            try:
                yield (*pair, link)
            finally:
                sweeps.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeps


async def sweep_every_second(client: Client, task_queue: str) -> None:
    while True:
        await client.execute_workflow(
            WatchWorkers.run,
            WatchInput(lost_after_seconds=FAST.lost_after_seconds),
            id=f"liveness-{uuid.uuid4().hex[:12]}",
            task_queue=task_queue,
            execution_timeout=timedelta(minutes=2),
        )
        await asyncio.sleep(1)


def writes(events: Path) -> dict[str, list[tuple[str, float]]]:
    """Attempt -> [(what, when)] as the work itself wrote them."""
    seen: dict[str, list[tuple[str, float]]] = {}
    # The work may be writing as this reads: a last line without its newline is not whole yet.
    for line in events.read_text().split("\n")[:-1]:
        what, attempt, at = line.split()
        seen.setdefault(attempt, []).append((what, float(at)))
    return seen


# The first attempt writes every 0.1 s until it is stopped; the second ends at once.
def witness(events: Path, first_runs_for: str = "forever") -> str:
    note = f'note() {{ echo "$1 $GPUPROV_ATTEMPT $(date +%s.%N)" >> {events}; }}'
    first = (
        "trap 'note term; exit 143' TERM; while :; do note alive; sleep 0.1; done"
        if first_runs_for == "forever"
        else f"end=$(( $(date +%s) + {first_runs_for} )); "
        'while [ "$(date +%s)" -lt "$end" ]; do note alive; sleep 0.1; done'
    )
    return f'{note}; note start; if [ "$GPUPROV_ATTEMPT" = 1 ]; then {first}; fi; note end'


def forget_leaked(cloud: FakeCloud, vm: str) -> None:
    """The test's own cleanup of the machine whose delete it made fail: its agent is stopped and
    the fake cloud lets it go (the reconciler's job in production)."""
    for row in cloud.live_instances():
        if row.vm == vm:
            machine = cloud.nodes.get(row.id)
            if machine is not None:
                machine.kill()
            cloud.state.mark_deleted(row.vm, row.region, [row.id])
            cloud.state.delete_side_resources(row.vm, row.region)


async def test_a_cut_off_node_whose_delete_fails_stops_its_work_before_the_new_attempts_starts(
    client, task_queue, job_name, sqlite_records, tmp_path
):
    events = tmp_path / "events"
    spec = job(job_name, 1, run=witness(events), recovery={"max_restarts": 1})
    stuck = FaultRule(primitive="delete", kind=ErrorKind.FAILED, vm=f"{job_name}-a1",
                      message="the delete is stuck")  # fmt: skip
    async with linked_nodes(client, task_queue, sqlite_records, stuck) as (gpuprov, cloud, link):
        handle = await gpuprov.submit(spec)
        running = await until(handle, lambda s: s.state is JobState.RUNNING, 120)
        assert running.attempts[-1].offer.id == OFFER_A
        await until(handle, lambda s: events.exists() and len(writes(events)["1"]) > 3, 60)
        cut_at = time.time()
        link.cut()
        final = await asyncio.wait_for(handle.result(), 180)
        old_vm = running.live_nodes()[0].vm
        forget_leaked(cloud, old_vm)
        await asyncio.sleep(cloud.config.delete_delay_seconds + 0.1)  # the fake's delete delay
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED, final.error
    assert [a.offer.id for a in final.attempts] == [OFFER_A, OFFER_B]
    assert len(final.restarts) == 1 and "went silent" in final.restarts[0].cause
    assert any("the delete is stuck" in leak for leak in final.leaks)  # the delete never landed
    seen = writes(events)
    assert sorted(seen) == ["1", "2"]  # GPUPROV_ATTEMPT: 1, then 2
    first_end = max(at for _, at in seen["1"])
    second_start = min(at for _, at in seen["2"])
    assert first_end < second_start  # never two attempts at once
    assert [what for what, _ in seen["1"]][-1] == "term"  # its node stopped it: SIGTERM
    # Stopped within the lease and the grace period of the cut (the last heartbeat answered
    # was sent before it), plus the agent's half-second look and a loaded machine's slack.
    assert first_end - cut_at < FAST.lease + JOBS.stop_grace_seconds + 5
    [old] = [w for w in final.workers if w.vm == old_vm]
    assert old.work_ends_by is not None
    assert second_start >= old.work_ends_by.timestamp()  # the new work waited it out


# A bad link: up to half a second late, 30% of requests lost and 10% answered 503 by the link,
# at most 3 in a row per node (4 heartbeats of 0.8 s at most: well inside lost_after's 5 s).
JITTER = {"delay": 0.5, "drop_share": 0.3, "error_share": 0.1, "max_in_a_row": 3}


async def test_a_jittery_link_and_failed_cloud_checks_never_restart_a_healthy_job(
    client, task_queue, job_name, sqlite_records, tmp_path
):
    events = tmp_path / "events"
    spec = job(job_name, 1, run=witness(events, first_runs_for="40"),
               health_check_interval_seconds=1, recovery={"max_restarts": 2})  # fmt: skip
    async with linked_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud, link):
        handle = await gpuprov.submit(spec)
        await until(handle, lambda s: s.state is JobState.RUNNING, 120)
        await until(handle, lambda s: events.exists() and len(writes(events)["1"]) > 3, 60)
        link.jitter(**JITTER)
        # and two of the cloud's health checks of the node fail (its observe, its diagnosis)
        failing = FaultRule(primitive="observe", kind=ErrorKind.FAILED, vm=f"{job_name}-a1",
                            times=2, message="the cloud's API failed")  # fmt: skip
        cloud.config.faults.append(failing)
        final = await asyncio.wait_for(handle.result(), 180)
        assert_nothing_left(cloud)
        fired = cloud.fired(failing)
    assert final.state is JobState.COMPLETED, final.error
    assert final.restarts == [] and len(final.attempts) == 1
    assert [what for what, _ in writes(events)["1"]][-1] == "end"  # the work ran to its end
    assert sorted(writes(events)) == ["1"]
    # the blips happened: heartbeats lost, answered 503, late, and the cloud's checks failed
    assert link.dropped > 5 and link.errors > 2 and link.delayed > 20, vars(link)
    assert fired == 2


async def test_the_same_link_cut_for_good_restarts_the_job_exactly_once(
    client, task_queue, job_name, sqlite_records, tmp_path
):
    events = tmp_path / "events"
    spec = job(job_name, 1, run=witness(events), recovery={"max_restarts": 2})
    async with linked_nodes(client, task_queue, sqlite_records) as (gpuprov, cloud, link):
        handle = await gpuprov.submit(spec)
        await until(handle, lambda s: s.state is JobState.RUNNING, 120)
        await until(handle, lambda s: events.exists() and len(writes(events)["1"]) > 3, 60)
        link.jitter(**JITTER)
        await asyncio.sleep(5)
        link.cut()
        final = await asyncio.wait_for(handle.result(), 180)
        assert_nothing_left(cloud)
    assert final.state is JobState.COMPLETED, final.error
    assert len(final.restarts) == 1 and "went silent" in final.restarts[0].cause
    assert [a.offer.id for a in final.attempts] == [OFFER_A, OFFER_B]
    seen = writes(events)
    assert max(at for _, at in seen["1"]) < min(at for _, at in seen["2"])
