"""A whole ProvisionJob on machines you own, from plan to release, against a local sshd.

Real Temporal dev server, real API, real database, real sshd, the real node agent. The pool
has a cheaper machine that is down and a dearer one that is up: the job fails over from the
first (Failed: unreachable) to the second, whose sshd it reaches with its host key verified; the
workflow's bootstrap step uploads the agent and hands it a fresh token over SSH; the agent
registers through the API and the job is placed on it. A job naming an image is never offered
these machines, and says why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from temporalio.client import Client

from activities.bootstrap import REMOTE_ROOT
from activities.ssh_keys import KeyStore
from gpuprov.api.app import create_app, serving
from gpuprov.engine.worker import build_worker, open_records
from gpuprov.models import AttemptOutcome, JobState
from gpuprov.sdk.client import GpuprovClient
from gpuprov.store.db import VmRecord, WorkerRecord
from gpuprov.store.ssh_records import SshRecords
from providers.base import Verdict
from providers.errors import ErrorKind
from providers.ssh.cloud import SshMachines
from providers.ssh.config import SshConfig, SshHost
from providers.ssh_common import AGENT_FILE
from tests.helpers import job, until
from tests.providers.refusals import assert_refused, refused
from tests.sshd import free_port, running_sshd

pytestmark = pytest.mark.slow  # measured: docs/testing.md, "The fast lane"

# A job waits in queued (planning) and then provisioning (an offer being brought up).
WAITING_STATES = (JobState.QUEUED, JobState.PROVISIONING)


async def bootstrap_result(client: Client, job_name: str) -> dict[str, Any]:
    """What the workflow's bootstrap step returned, read back from the job's history."""
    history = await client.get_workflow_handle(f"job-{job_name}").fetch_history()
    scheduled = {
        event.event_id
        for event in history.events
        if event.HasField("activity_task_scheduled_event_attributes")
        and event.activity_task_scheduled_event_attributes.activity_type.name == "bootstrap"
    }
    for event in history.events:
        if event.HasField("activity_task_completed_event_attributes"):
            completed = event.activity_task_completed_event_attributes
            if completed.scheduled_event_id in scheduled:
                [payload] = completed.result.payloads
                return json.loads(payload.data)
    raise AssertionError("no completed bootstrap step in the job's history")


def rows(records: Any, table: Any) -> list[Any]:
    with records.db.session() as session:
        return list(session.exec(select(table)).all())


async def test_a_job_fails_over_to_the_reachable_machine_registers_and_releases_it(
    tmp_path: Path, client: Client, task_queue: str, job_name: str
) -> None:
    records = open_records(f"sqlite:///{tmp_path / 'gpuprov.db'}")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}"
    with running_sshd(tmp_path / "sshd", rsa_too=True) as sshd:
        machines = SshMachines(
            SshConfig(
                hosts=[
                    SshHost(
                        name="down",
                        host="127.0.0.1",
                        port=free_port(),
                        key_path="/dev/null",
                        price=1.0,
                    ),
                    SshHost(
                        name="box",
                        host="127.0.0.1",
                        port=sshd.port,
                        key_path=str(sshd.client_key_path),
                        price=2.0,
                    ),
                ],
                claims_url=f"sqlite:///{tmp_path / 'claims.db'}",
                boot_timeout=20,
                delete_timeout=10,
                poll_interval=0.2,
                connect_timeout=2,
            )
        )
        worker = build_worker(
            client,
            task_queue,
            {"ssh": machines},
            records,
            api_url=api_url,
            ssh_keys=KeyStore(SshRecords(records.db), directory=tmp_path / "worker-keys"),
            ssh_bootstrap={"ssh"},  # what `[providers.ssh]` gives (ssh_bootstrap defaults true)
        )
        api = create_app(records)
        try:
            async with serving(api, "127.0.0.1", port), worker:
                gpuprov = GpuprovClient(client, task_queue)
                spec = job(
                    job_name,
                    resources={"gpus_per_node": 0},
                    placement={"providers": ["ssh"]},
                    provisioning_timeout_seconds=60,
                )
                handle = await gpuprov.submit(spec)

                ready = await until(handle, lambda s: s.state not in WAITING_STATES, timeout=60)
                [node] = ready.live_nodes()
                assert node.ssh is not None and node.instance_ids == ["box"]
                booted = await bootstrap_result(client, job_name)
                [health] = await gpuprov.health(job_name)  # diagnosis + SSH probe of the node
                installed = (sshd.home / REMOTE_ROOT / node.vm / AGENT_FILE).exists()
                await handle.release()
                final = await until(handle, lambda s: s.state.terminal, timeout=30)
                claims_after = machines._claims.held()
        finally:
            await machines.aclose()
            records.db.dispose()

    assert ready.state is JobState.READY, ready.error
    first, second = ready.attempts
    assert first.offer.id == "ssh/owned/down" and first.outcome is AttemptOutcome.FAILED
    assert first.kind is ErrorKind.FAILED and "unreachable" in (first.message or "")
    assert second.offer.id == "ssh/owned/box"
    [placed] = ready.nodes[-1:]
    assert placed.worker_id == booted["worker_id"]
    assert booted["host_key_fingerprint"] == sshd.host_fingerprint
    assert booted["host_key_trust"] == "fingerprint"  # the pool verified it, bootstrap checked it
    assert installed
    assert health.verdict is Verdict.HEALTHY, health
    assert [f.code for f in health.findings] == ["ssh_ok"]
    assert "the agent answers" in health.findings[0].message

    assert final.state is JobState.COMPLETED
    assert claims_after == {}  # the machine is free for the next job
    assert not (sshd.home / REMOTE_ROOT).exists()  # cleanup removed the agent
    vms = {row.vm: row for row in rows(records, VmRecord)}
    assert {row.status for row in vms.values()} == {"terminated"}
    [worker] = rows(records, WorkerRecord)
    assert (worker.vm, worker.provider, worker.state) == (placed.vm, "ssh", "revoked")


async def test_a_job_naming_an_image_never_gets_a_machine_you_own_and_says_why(
    client, task_queue, job_name, tmp_path: Path
):
    box = SshHost(name="box-1", host="127.0.0.1", key_path="/dev/null", gpu="H100", gpu_count=8)
    machines = SshMachines(SshConfig(hosts=[box], claims_url=f"sqlite:///{tmp_path / 'claims.db'}"))
    spec = job(job_name, image="nvcr.io/nvidia/pytorch:24.05-py3", provisioning_timeout_seconds=30)
    try:
        refusal = await refused(client, task_queue, machines, spec)
    finally:
        await machines.aclose()
    assert_refused(refusal, "ssh", "ssh cannot run a container image")
