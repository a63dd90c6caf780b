"""Hostile raw starts of ProvisionJob among a run's jobs, and what each must do.

A workflow can be started by anything that reaches Temporal, with any input: bytes the worker
cannot decode, wrong types, a missing name, values no timer can hold, a workflow id that is not
`job-<name>`. The first hostile start of a run is an impostor: its spec carries the name of a
real job of the run under another job's workflow id. It is started once that real job is ready
(the job is held there until the impostor has been judged), so it has something to touch.

Each start must fail at once (no activity, no local activity, no failed workflow task) with a
non-retryable `InvalidJobSpec` whose message names the field, with `GpuprovState=failed`, and
create nothing: no VM, token, worker or cost row and no machine under its name. The impostor's
real job keeps every machine and worker it had, and is still ready, when the impostor has
failed; only then is it released.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from chaos.report import Check
from gpuprov import contract
from gpuprov.models import JobState
from providers.fake import FakeCloudState

if TYPE_CHECKING:
    from chaos.plan import JobRun
    from chaos.run import ChaosRun

TARGET_POLL = 0.5  # seconds between looks at the impostor's real job
NOT_AT_ONCE = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "a failed workflow task",
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "an activity",
    EventType.EVENT_TYPE_MARKER_RECORDED: "a local activity",
}
TABLES = ("vms", "join_tokens", "cost_records", "workers", "work")


def _raw(data: bytes, encoding: bytes = b"json/plain") -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding}, data=data))


def _spec(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"gpu": "H100", "gpus_per_node": 8}, **fields}


def _json(name: str, **fields: Any) -> RawValue:
    return _raw(json.dumps(_spec(name, **fields)).encode())


def _with(name: str, tail: bytes) -> RawValue:
    """A valid spec with `tail` (JSON the encoder would never write) added to it."""
    text = json.dumps(_spec(name)).encode()
    return _raw(text[:-1] + b", " + tail + b"}")


@dataclass(frozen=True)
class Case:
    payload: Callable[[str], RawValue]  # the name its spec carries -> the start's input
    names: str  # what the error must name


IMPOSTOR = "workflow id not job-<name>: named like a real job"
CASES: dict[str, Case] = {
    IMPOSTOR: Case(_json, "name"),
    "undecodable: truncated JSON": Case(
        lambda name: _raw(json.dumps(_spec(name)).encode()[:-3]), "JSON"
    ),
    "undecodable: not JSON": Case(lambda name: _raw(b"name: train"), "JSON"),
    "undecodable: binary payload": Case(lambda name: _raw(b"\x00\x01", b"binary/plain"), "mapping"),
    "wrong type: nodes a word": Case(lambda name: _json(name, nodes="many"), "nodes"),
    "wrong type: resources a list": Case(lambda name: _json(name, resources=[]), "resources"),
    "missing name": Case(lambda name: _raw(b'{"nodes": 1}'), "name"),
    "past the bound: 257 nodes": Case(lambda name: _json(name, nodes=257), "nodes"),
    "no timer can hold: provisioning_timeout_seconds 1e19": Case(
        lambda name: _json(name, provisioning_timeout_seconds=1e19),
        "provisioning_timeout_seconds",
    ),
    "no timer can hold: health_check_interval_seconds 1e19": Case(
        lambda name: _json(name, health_check_interval_seconds=1e19),
        "health_check_interval_seconds",
    ),
    "no timer can hold: provisioning_timeout_seconds Infinity": Case(
        lambda name: _with(name, b'"provisioning_timeout_seconds": Infinity'),
        "provisioning_timeout_seconds",
    ),
}


@dataclass(frozen=True)
class Holdings:
    """What a job holds: its machines in the cloud's ledger and its workers' states."""

    machines: frozenset[str]  # instance ids not deleted
    workers: tuple[tuple[str, str], ...]  # (worker id, state)

    def lost(self, now: Holdings) -> list[str]:
        gone = sorted(self.machines - now.machines)
        changed = sorted(set(self.workers) - set(now.workers))
        return [f"machine {m} deleted" for m in gone] + [
            f"worker {w} no longer {state}" for w, state in changed
        ]


async def start_hostile(run: ChaosRun, job: JobRun) -> None:
    """Start the job's hostile case (the impostor once its real job is ready or has ended),
    judge how it ended, and release the real job."""
    role = job.role
    assert role.hostile is not None
    case = CASES[role.hostile]
    target = run.job_named(role.impersonates) if role.impersonates else None
    before: Holdings | None = None
    if target is not None:
        await _ready_or_ended(target, run.options.deadline)
        if target.state:
            job.notes.append(f"its real job {target.name} had ended {target.state} before it")
        else:
            before = await asyncio.to_thread(_holdings, run, target.name)
    client = run.client
    assert client is not None
    payload = case.payload(role.impersonates or job.name)

    async def start() -> None:
        await client.start_workflow(
            contract.PROVISION_JOB, payload, id=job.workflow_id, task_queue=run.task_queue
        )

    job.submitted_wall = time.time()
    try:
        await run.retrying(f"start {job.name}", start)
        job.handle = run.gpuprov.job(job.name)
        job.submitted_at = time.monotonic()
        job.last_seen = "queued"
        run.event(f"hostile start {job.workflow_id}: {role.hostile}")
        job.problems += await _judge(run, job, case)
        if target is not None and before is not None:
            job.problems += await _untouched(run, target, before)
    except Exception as error:  # a check that could not be made is a failed check
        job.problems.append(f"the harness could not judge it: {type(error).__name__}: {error}")
    finally:
        if target is not None and not target.released:
            run.release_now(target)  # held for the impostor; it must still end


async def _ready_or_ended(target: JobRun, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if target.state or target.last_seen == JobState.READY.value:
            return
        await asyncio.sleep(TARGET_POLL)


async def _judge(run: ChaosRun, job: JobRun, case: Case) -> list[str]:
    client = run.client
    assert client is not None
    handle = client.get_workflow_handle(job.workflow_id)
    problems = []
    try:
        await run.retrying(f"result of {job.name}", handle.result, timeout=run.options.deadline)
        problems.append("it completed")
    except WorkflowFailureError as failed:
        cause = failed.cause
        job.error = str(cause)
        if not isinstance(cause, ApplicationError) or cause.type != "InvalidJobSpec":
            problems.append(f"it failed with {type(cause).__name__} {cause}, not InvalidJobSpec")
        elif not cause.non_retryable:
            problems.append("its InvalidJobSpec is retryable")
        elif case.names not in cause.message:
            problems.append(f"the error does not name {case.names!r}: {cause.message[:200]}")
        elif job.role.impersonates and f"job-{job.role.impersonates}" not in cause.message:
            problems.append(f"the error does not name job-{job.role.impersonates}")
    description = await run.retrying(f"describe {job.name}", handle.describe)
    if description.status is not WorkflowExecutionStatus.FAILED:
        problems.append(f"it ended {description.status}")
    state = description.typed_search_attributes.get(contract.STATE)
    if state != JobState.FAILED.value:
        problems.append(f"GpuprovState is {state!r}, not failed")
    history = await run.retrying(f"history of {job.name}", handle.fetch_history)
    seen = {NOT_AT_ONCE[e.event_type] for e in history.events if e.event_type in NOT_AT_ONCE}
    problems += [f"not at once: its history has {what}" for what in sorted(seen)]
    problems += await asyncio.to_thread(_created, run, job.name)
    return problems


def _created(run: ChaosRun, name: str) -> list[str]:
    """Anything recorded or created under `name` (the job its workflow id names)."""
    assert run.records is not None
    created = []
    with run.records.db.engine.connect() as connection:
        for table in TABLES:
            column = "vm" if table == "join_tokens" else "job"
            pattern = f"{name}-a%" if column == "vm" else name
            operator = "LIKE" if column == "vm" else "="
            rows = connection.execute(
                sa.text(f"SELECT count(*) FROM {table} WHERE {column} {operator} :value"),
                {"value": pattern},
            ).scalar_one()
            if rows:
                created.append(f"{rows} row(s) in {table}")
    state = FakeCloudState(str(run.state_path))
    try:
        machines = [row.id for row in state.instances() if row.vm.startswith(f"{name}-a")]
    finally:
        state.close()
    if machines:
        created.append(f"machines {', '.join(machines[:5])} in the cloud's ledger")
    return created


def _holdings(run: ChaosRun, name: str) -> Holdings:
    assert run.records is not None
    state = FakeCloudState(str(run.state_path))
    try:
        machines = frozenset(
            row.id
            for row in state.instances()
            if row.vm.startswith(f"{name}-a") and row.deleted_at is None
        )
    finally:
        state.close()
    workers = tuple(sorted((w.id, w.state) for w in run.records.workers_for_job(name)))
    return Holdings(machines, workers)


async def _untouched(run: ChaosRun, target: JobRun, before: Holdings) -> list[str]:
    now = await asyncio.to_thread(_holdings, run, target.name)
    held = before.lost(now)
    problems = [f"its real job {target.name} lost what it held: {lost}" for lost in held]
    assert target.handle is not None
    status = await run.retrying(f"status of {target.name}", target.handle.status)
    if status.state is not JobState.READY:
        problems.append(f"its real job {target.name} is {status.state.value}, no longer ready")
    if not problems:
        target.notes.append(
            f"an impostor failed while it was ready; its {len(before.machines)} machine(s) and "
            f"{len(before.workers)} worker(s) kept"
        )
    return problems


def judge_hostile(jobs: list[JobRun], seed: int) -> Check | None:
    """The check over every hostile start, from what `start_hostile` found."""
    hostile = [job for job in jobs if job.role.kind == "hostile"]
    if not hostile:
        return None
    problems = [
        f"seed {seed}: {job.workflow_id} ({job.role.hostile}): {problem}"
        for job in hostile
        for problem in job.problems or ([] if job.handle else ["never started"])
    ]
    kinds = Counter(
        f"impostor named {job.role.impersonates} under {job.workflow_id}"
        if job.role.impersonates
        else job.role.hostile or ""
        for job in hostile
    )
    value = f"{len(hostile)} start(s): " + "; ".join(
        f"{kind}" + (f" x{n}" if n > 1 else "") for kind, n in sorted(kinds.items())
    )
    return Check(
        "hostile starts: each failed at once naming the field, created nothing, touched no job",
        not problems,
        value,
        problems,
    )
