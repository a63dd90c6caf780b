"""The clouds' own notices, end to end: the fake cloud boots the real node agent watching a
metadata server on loopback that answers as EC2's (IMDSv2) or GCE's does (tests/metadata.py).
A reclaim notice reaches the work (SIGTERM, with the notice in $GPUPROV_NOTICE_FILE), the job
starts its replacement at once, well before the cloud's deadline, and its status names the
cause; the offer is blocked as "spot reclaimed"."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import Client

from gpuprov.api.app import create_app, serving
from gpuprov.cli.dev import free_port
from gpuprov.models import BlockScope, JobState
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.records import Records
from providers.errors import ErrorKind
from providers.fake import FakeCloud
from tests.helpers import OFFER_A, OFFER_B, assert_nothing_left, fake_worker, fast_cloud, job, until
from tests.metadata import MetadataServer
from tests.workflows.test_work_on_nodes import FAST, JOBS, sqlite_records

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

__all__ = ["sqlite_records"]  # the fixture, shared


@asynccontextmanager
async def watched_nodes(
    client: Client, task_queue: str, records: Records, cloud: str, metadata: MetadataServer
) -> AsyncIterator[tuple[GpuprovClient, FakeCloud]]:
    port = free_port()
    app = create_app(records, workers=FAST, jobs=JOBS, temporal=client)
    async with serving(app, "127.0.0.1", port):
        config = fast_cloud(agent="real", boot_timeout=60, notices=cloud, notices_url=metadata.url)
        url = f"http://127.0.0.1:{port}"
        async with fake_worker(client, task_queue, config, records, api_url=url) as pair:
            yield pair


def reclaim(metadata: MetadataServer, cloud: str) -> datetime:
    """The cloud says it takes the machine back; when it will."""
    now = datetime.now(UTC)
    if cloud == "ec2":
        deadline = now + timedelta(minutes=2)
        when = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
        metadata.set_ec2("spot/instance-action", {"action": "terminate", "time": when})
        return deadline
    metadata.set_gce("preempted", "TRUE")
    return now + timedelta(seconds=30)  # GCE's preemption notice: about 30 s


def withdraw(metadata: MetadataServer, cloud: str) -> None:
    """The replacement's machine is another machine: its metadata says nothing."""
    if cloud == "ec2":
        metadata.set_ec2("spot/instance-action", None)
    else:
        metadata.set_gce("preempted", "FALSE")


@pytest.mark.parametrize("cloud", ["ec2", "gce"])
async def test_a_reclaim_notice_starts_the_replacement_before_the_node_dies(
    client, task_queue, job_name, sqlite_records, tmp_path, cloud
):
    events, seen = tmp_path / "events", tmp_path / "notice-seen"
    note = f'note() {{ echo "$1 $GPUPROV_ATTEMPT $(date +%s.%N)" >> {events}; }}'
    first = (
        f"trap 'note term; cat \"$GPUPROV_NOTICE_FILE\" > {seen}; exit 143' TERM; "
        "while :; do note alive; sleep 0.1; done"
    )
    run = f'{note}; note start; if [ "$GPUPROV_ATTEMPT" = 1 ]; then {first}; fi; note end'
    spec = job(job_name, 1, run=run, recovery={"max_restarts": 1})
    with MetadataServer() as metadata:
        async with watched_nodes(client, task_queue, sqlite_records, cloud, metadata) as (
            gpuprov,
            fake,
        ):
            handle = await gpuprov.submit(spec)
            running = await until(handle, lambda s: s.state is JobState.RUNNING, 120)
            assert running.attempts[-1].offer.id == OFFER_A
            await until(handle, lambda s: events.exists() and "alive 1" in events.read_text(), 60)
            deadline = reclaim(metadata, cloud)
            restarting = await until(handle, lambda s: bool(s.restarts), 60)
            withdraw(metadata, cloud)
            final = await asyncio.wait_for(handle.result(), 120)
            assert_nothing_left(fake)
        asked = dict(metadata.requests)
    assert final.state is JobState.COMPLETED, final.error
    [restart] = final.restarts
    assert "spot reclaimed" in restart.cause and restart.at < deadline
    assert restarting.restarts[0].cause == restart.cause
    assert [a.offer.id for a in final.attempts] == [OFFER_A, OFFER_B]
    [block] = [b for b in final.blocks if b.scope is BlockScope.OFFER and b.key == OFFER_A]
    assert block.kind is ErrorKind.CAPACITY and "spot reclaimed" in block.message
    # the work got SIGTERM with the notice to read, and the new attempt ran before the deadline
    notice = json.loads(seen.read_text())
    assert (notice["kind"], notice["source"]) == ("reclaim", cloud)
    lines = [line.split() for line in events.read_text().splitlines()]
    assert ["term", "1"] in [line[:2] for line in lines]
    # SIGTERM goes to the work's whole process group, so a `date` it meets dies too and its
    # line has no time: only the lines that kept theirs are timed
    timed = [line for line in lines if len(line) == 3]
    second_start = min(float(at) for what, attempt, at in timed if attempt == "2")
    assert second_start < deadline.timestamp()
    if cloud == "ec2":
        assert asked.get("/latest/api/token", 0) >= 1  # IMDSv2: a session token first
    else:
        assert asked.get("/computeMetadata/v1/instance/preempted", 0) >= 1
