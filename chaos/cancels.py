"""Cancels at chosen points of a job's life, and what each cancelled job must do.

Each cancelled job has a point: queued (GpuprovState queued: the job looks for existing workers
and makes its first plan), planning (waiting for offers), creating, booting (waiting for its
machines to run), registering (waiting for its agents), ready, running or releasing. The
harness polls the job's status query and cancels it the first time the status shows that
point, or, when it only ever sees a later one (the point can be shorter than a poll), at the
first later point it sees; the summary says which. Short points are made longer by a fault
rule aimed at the job (whichever attempt gets there first), so that a poll can see them: a 3 s
create that lands whatever the job does meanwhile (creating: the cancel meets a create in
flight), a boot that hangs (booting), an agent that never registers
(registering), a 3 s delay on a cleanup (releasing). A job cancelled at `ready` is held there
(never released); at `releasing` it is released when ready, then cancelled while it tears
down; at `running` it is a job that runs until it is stopped.

The promise: a cancelled job ends `cancelled`; it may end completed or failed only if it ended
first: it closed before the cancel arrived, or in the very workflow task that saw it. Its
history tells: a workflow task completed after the cancel request, other than the one that
closed the job, means the job saw the cancel and went on. And nothing of it stays live: no
machine or side resource of it is live before the reconcile pass without an orphan record
naming it, and none after the pass.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from temporalio.api.enums.v1 import EventType

from chaos.report import Check
from gpuprov.config import FaultRule
from gpuprov.models import JobState, JobStatus
from gpuprov.sdk.client import GpuprovError, JobNotFound
from providers.errors import ErrorKind

if TYPE_CHECKING:
    from chaos.plan import JobRun
    from chaos.run import ChaosRun

POINTS = (
    "queued",
    "planning",
    "creating",
    "booting",
    "registering",
    "ready",
    "running",
    "releasing",
)
POLL = 0.5  # seconds between status queries of a job waiting for its point (each is a task)
QUERY_TIMEOUT = 10.0  # a query waits for a worker; one that was killed answers nothing
AID_DELAY = 3.0


def points_shown(status: JobStatus) -> list[str]:
    """The points the status shows, in order (none during a failover's teardown, a wait for a
    block to lapse, or at the end). The first plan runs while the job is still queued, so a
    status can show both queued and planning; provisioning is told apart by what the job says
    it waits for."""
    state, waiting = status.state, status.waiting_for or ""
    if state.terminal:
        return []
    if state in (JobState.READY, JobState.RUNNING, JobState.RELEASING):
        return [state.value]
    shown = ["queued"] if state is JobState.QUEUED else []
    if waiting.startswith("offers from"):
        shown.append("planning")
    elif waiting.startswith(("create ", "prepare on")):
        shown.append("creating")
    elif waiting.startswith("running: "):
        shown.append("booting")
    elif waiting.startswith("registration of"):
        shown.append("registering")
    return shown


def aid_rules(job: str, point: str) -> list[FaultRule]:
    """Fault rules that make `point` long enough to be seen (none for the long ones)."""
    message = f"chaos: to cancel {job} while {point}"
    aids = {
        # The create is still carried out after the cancel: a request already at the cloud.
        "creating": dict(primitive="create", effect="lands_late", delay_seconds=AID_DELAY),
        "booting": dict(primitive="create", effect="boot_hang"),
        "registering": dict(primitive="create", effect="no_agent"),
        "releasing": dict(primitive="cleanup", effect="delay", delay_seconds=AID_DELAY),
    }
    fields = aids.get(point)
    if fields is None:
        return []
    # Any attempt: the first one may fail before it gets there (a fault aimed at it).
    vm = f"{job}-a"
    return [FaultRule(kind=ErrorKind.TRANSIENT, message=message, vm=vm, times=1, **fields)]


async def cancel_at_point(run: ChaosRun, job: JobRun) -> None:
    """Poll the job's status; cancel it at its point (or the first later one seen)."""
    assert job.role.cancel_at is not None and job.handle is not None
    target = POINTS.index(job.role.cancel_at)
    handle = job.handle
    seen: list[str] = []
    while not job.state:
        try:
            status = await asyncio.wait_for(handle.status(), QUERY_TIMEOUT)
        except JobNotFound:
            break
        except (GpuprovError, TimeoutError, RuntimeError):
            await asyncio.sleep(POLL)
            continue
        if status.state.terminal:
            break
        shown = points_shown(status)
        if shown and (not seen or seen[-1] != "+".join(shown)):
            seen.append("+".join(shown))
        if job.role.cancel_at in shown:
            await _send(run, job, job.role.cancel_at, status)
            return
        if shown and POINTS.index(shown[-1]) > target:  # the point passed between two polls
            await _send(run, job, shown[-1], status)
            return
        await asyncio.sleep(POLL)
    job.cancel = f"not sent: it ended {job.state or 'first'} before reaching {job.role.cancel_at}"
    job.cancel += f" (seen: {', '.join(seen) or 'nothing'})"


async def _send(run: ChaosRun, job: JobRun, here: str, status: JobStatus) -> None:
    assert job.handle is not None
    handle = job.handle
    aimed = job.role.cancel_at
    shown = f"{status.state.value}: {status.waiting_for or '-'}"
    try:
        await run.retrying(f"cancel {job.name}", handle.cancel)
    except JobNotFound as error:
        job.cancel = f"too late ({error})"
    except Exception as error:  # reported, never fatal: the job still has to end
        job.cancel = f"failed to send: {error}"
    else:
        job.cancel_sent_at = here
        job.cancel = f"sent at {here}" + ("" if here == aimed else f" (aimed at {aimed})")
        job.cancel += f"; the status said {shown[:160]}"
    run.event(f"cancel {job.name}: {job.cancel}")


# ---------------------------------------------------------------- the verdict


async def judge_cancels(run: ChaosRun, jobs: list[JobRun], leftovers: dict[str, list[str]]):
    """The check over every cancelled job. `leftovers`: job -> what it left live."""
    cancelled = [job for job in jobs if job.role.cancel_at is not None]
    if not cancelled:
        return None
    problems, sent_at, outcomes = [], Counter(), Counter()
    for job in cancelled:
        left = leftovers.get(job.name, [])
        problems += [f"{job.name} (cancelled at {job.cancel_sent_at}): left {x}" for x in left]
        if job.cancel_sent_at is None:
            outcomes[f"not sent, ended {job.state}"] += 1
            continue
        sent_at[job.cancel_sent_at] += 1
        if job.state == "cancelled":
            outcomes["cancelled"] += 1
            continue
        went_on = await _went_on_after_cancel(run, job)
        if went_on:
            problems.append(
                f"{job.name}: cancelled at {job.cancel_sent_at}, ended {job.state}: {went_on}; "
                f"error: {(job.error or '-').splitlines()[0][:200]}"
            )
        else:
            outcomes[f"ended {job.state} first"] += 1
            job.notes.append(f"ended {job.state} before the cancel took effect")
    aimed = {job.role.cancel_at for job in cancelled}
    missed = sorted(aimed - set(sent_at), key=POINTS.index)
    value = (
        f"{len(cancelled)} cancel(s); sent at: "
        + (", ".join(f"{p} {sent_at[p]}" for p in POINTS if sent_at[p]) or "none")
        + "; outcomes: "
        + ", ".join(f"{what} {n}" for what, n in sorted(outcomes.items()))
        + (f"; points aimed at but never seen first: {', '.join(missed)}" if missed else "")
    )
    return Check(
        "cancels at chosen points: each ended cancelled (or ended first) and left nothing live",
        not problems,
        value,
        [f"seed {run.options.seed}: {line}" for line in problems],
    )


async def _went_on_after_cancel(run: ChaosRun, job: JobRun) -> str | None:
    """Why the history shows the job went on after it saw the cancel, or None."""
    assert run.client is not None
    handle = run.client.get_workflow_handle(job.workflow_id)
    history = await run.retrying(f"history of {job.name}", handle.fetch_history)
    types = [event.event_type for event in history.events]
    requested = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
    if requested not in types:
        return None  # it closed before the cancel arrived
    after = types.index(requested)
    completed = [
        index
        for index, kind in enumerate(types)
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and index > after
    ]
    if len(completed) <= 1:  # at most the task that closed it
        return None
    return f"{len(completed) - 1} workflow task(s) completed after the cancel request"
