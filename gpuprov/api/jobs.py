"""Jobs over HTTP, for any language: the API submits, lists, reads and ends jobs on Temporal.

    POST /v1/jobs                    a job spec (JSON, or YAML with Content-Type application/yaml)
    GET  /v1/jobs[?state=&team=&provider=&page_size=&page_token=]   the jobs, newest first
    GET  /v1/jobs/{name}             its status (`JobStatus`)
    POST /v1/jobs/{name}/release     the `release` signal
    POST /v1/jobs/{name}/cancel      cancel it: whatever it holds is torn down

Submitting, releasing and cancelling need a member of the job's team (or an admin); reading a
viewer of it. A member's spec that names no team is its team's. The spec is checked as
`gpuprov submit` checks it (one line naming each bad field, 422), and so are its secret
references (a name the team cannot see is 422 naming the variable). Submitting is idempotent:
the same spec again while its job runs answers that job (200, `created: false`); another spec
under a running name is 409. A name whose job has ended starts a new run of it, as with the
CLI. The job's team is its `GpuprovTeam` search attribute (set at start). Without a Temporal
client these routes answer 503; the SDK and CLI keep talking to Temporal themselves.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.service import RPCError, RPCStatusCode

from gpuprov import contract
from gpuprov.api.auth import BODY_REFUSALS, ROLE_REFUSALS, Caller, require_member, require_viewer
from gpuprov.api.work import JobWaker
from gpuprov.models import (
    JOB_NAME_PATTERN,
    TEAM_NAME_PATTERN,
    JobSpec,
    JobSpecError,
    JobState,
    JobStatus,
    parse_job_text,
    workflow_id_for,
)
from gpuprov.sdk.client import (
    GpuprovClient,
    GpuprovError,
    JobAlreadyExists,
    JobNotFound,
    JobSummary,
)
from gpuprov.store.secrets import Vault, unknown_secret
from providers import PROVIDER_IDS
from providers.base import Model

MAX_SPEC_BYTES = 64 * 1024  # the body limit: a spec is a few hundred bytes
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
NO_TEMPORAL = {503: {"description": "Temporal cannot be reached now; see Retry-After"}}
NO_JOB = {404: {"description": "no job of that name"}}
SPEC_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "a job spec (docs/job-spec.md), as JSON or as YAML",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}
_STATES = "^(" + "|".join(state.value for state in JobState) + ")$"
_PROVIDERS = "^(" + "|".join(PROVIDER_IDS) + ")$"
JobName = Annotated[str, Path(pattern=JOB_NAME_PATTERN)]


class Submitted(Model):
    name: str
    team: str
    created: bool  # False: the same spec's job was running already
    status: JobStatus | None = None  # None while the new job has not answered yet


class JobPage(Model):
    jobs: list[JobSummary]
    next_page_token: str | None = None  # pass as page_token for the next page


class Ended(Model):
    name: str
    requested: str  # "release" or "cancel"


def _unavailable(error: Exception | str) -> HTTPException:
    return HTTPException(
        503, f"Temporal cannot be reached now: {error}", headers={"Retry-After": "5"}
    )


async def jobs_client(request: Request) -> GpuprovClient:
    waker: JobWaker = request.app.state.waker
    client: Client | None = await waker.client()
    if client is None:
        raise _unavailable("the API has no Temporal client")
    return GpuprovClient(client, request.app.state.task_queue)


async def _spec_of(request: Request, caller: Caller) -> JobSpec:
    """The body's spec (422 naming each bad field); a member's that names no team is its
    team's."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    kind = "yaml" if media in YAML_TYPES else "json"
    try:
        spec = parse_job_text((await request.body()).decode("utf-8"), kind, "job spec")
    except UnicodeDecodeError:
        raise HTTPException(422, "the job spec is not UTF-8 text") from None
    except JobSpecError as invalid:
        raise HTTPException(422, str(invalid)) from None
    if caller.team is not None and "team" not in spec.model_fields_set:
        spec = spec.model_copy(update={"team": caller.team})
    return spec


async def _check_secrets(request: Request, spec: JobSpec) -> None:
    vault: Vault = request.app.state.vault
    for variable, names in spec.secret_references().items():
        missing = await asyncio.to_thread(vault.missing, spec.team, names)
        if missing:
            raise HTTPException(422, unknown_secret(variable, missing[0], spec.team))


async def describe_job(jobs: GpuprovClient, name: str) -> WorkflowExecutionDescription:
    """The job's workflow as Temporal describes it; 404 when there is no such job."""
    handle = jobs.temporal.get_workflow_handle(workflow_id_for(name))
    try:
        return await handle.describe()
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise HTTPException(404, f"no job named {name!r}") from None
        raise _unavailable(error.message) from None


def team_in(description: WorkflowExecutionDescription) -> str:
    """The job's team, from its `GpuprovTeam` (the default team for a job from before teams)."""
    return description.typed_search_attributes.get(contract.TEAM) or "default"


async def team_of_job(jobs: GpuprovClient, name: str) -> str:
    """The job's team; 404 when there is no such job."""
    return team_in(await describe_job(jobs, name))


async def _started_spec(jobs: GpuprovClient, name: str) -> JobSpec | None:
    """The spec the running job `name` was started with (None: not readable as one)."""
    handle = jobs.temporal.get_workflow_handle(workflow_id_for(name))
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if not payloads:
            return None
        try:
            [decoded] = await jobs.temporal.data_converter.decode(payloads, [JobSpec])
        except Exception:  # a start with other input (raw JSON that is not a spec, ...)
            return None
        return decoded if isinstance(decoded, JobSpec) else None
    return None


async def status_or_none(jobs: GpuprovClient, name: str) -> JobStatus | None:
    try:
        return await asyncio.wait_for(jobs.job(name).status(), 10)
    except (GpuprovError, TimeoutError):
        return None  # no worker has answered for it yet


def decode_page_token(token: str | None) -> bytes | None:
    if token is None:
        return None
    try:
        return base64.urlsafe_b64decode(token.encode())
    except (binascii.Error, ValueError):
        raise HTTPException(422, "page_token: not a token this API gave") from None


def encode_page_token(token: bytes | None) -> str | None:
    return base64.urlsafe_b64encode(token).decode() if token else None


def add_routes(app: FastAPI, task_queue: str) -> None:
    app.state.task_queue = task_queue

    @app.post(
        "/v1/jobs",
        responses={
            **ROLE_REFUSALS,
            **BODY_REFUSALS,
            **NO_TEMPORAL,
            201: {"description": "the job was started"},
            409: {"description": "a job of that name runs with another spec"},
            422: {"description": "the spec is invalid: each bad field named"},
        },
        status_code=200,
        openapi_extra=SPEC_BODY,
    )
    async def submit_job(
        request: Request, response: Response, caller: Annotated[Caller, Depends(require_member)]
    ) -> Submitted:
        """Start a job from its spec; the same spec again while it runs is the same job."""
        spec = await _spec_of(request, caller)
        caller.check_acts_on(spec.team, f"job {spec.name!r}")
        await _check_secrets(request, spec)
        jobs = await jobs_client(request)
        try:
            await jobs.submit(spec)
        except JobAlreadyExists:
            running = await _started_spec(jobs, spec.name)
            if running != spec:
                raise HTTPException(
                    409, f"a job named {spec.name!r} is running with another spec"
                ) from None
            status = await status_or_none(jobs, spec.name)
            return Submitted(name=spec.name, team=spec.team, created=False, status=status)
        except GpuprovError as error:
            raise _unavailable(error) from None
        response.status_code = 201
        return Submitted(name=spec.name, team=spec.team, created=True)

    @app.get("/v1/jobs", responses={**ROLE_REFUSALS, **NO_TEMPORAL})
    async def list_jobs(
        request: Request,
        caller: Annotated[Caller, Depends(require_viewer)],
        state: Annotated[str | None, Query(pattern=_STATES)] = None,
        team: Annotated[str | None, Query(pattern=TEAM_NAME_PATTERN)] = None,
        provider: Annotated[str | None, Query(pattern=_PROVIDERS)] = None,
        page_size: Annotated[int, Query(ge=1, le=500)] = 100,
        page_token: Annotated[str | None, Query(max_length=4096)] = None,
    ) -> JobPage:
        """The jobs (a member's or viewer's: its team's), newest first, a page at a time."""
        if team is None:
            team = caller.team
        else:
            caller.check_reads(team, "the jobs")
        jobs = await jobs_client(request)
        try:
            page, token = await jobs.list_page(
                state=JobState(state) if state else None,
                provider=provider,
                team=team,
                page_size=page_size,
                page_token=decode_page_token(page_token),
            )
        except GpuprovError as error:
            raise _unavailable(error) from None
        return JobPage(jobs=page, next_page_token=encode_page_token(token))

    @app.get("/v1/jobs/{name}", responses={**ROLE_REFUSALS, **NO_TEMPORAL, **NO_JOB})
    async def job_status(
        request: Request, name: JobName, caller: Annotated[Caller, Depends(require_viewer)]
    ) -> JobStatus:
        jobs = await jobs_client(request)
        caller.check_reads(await team_of_job(jobs, name), f"job {name!r}")
        try:
            return await jobs.job(name).status()
        except GpuprovError as error:
            raise _unavailable(error) from None

    for action in ("release", "cancel"):
        _add_ending(app, action)


async def end_job(request: Request, caller: Caller, name: str, action: str) -> None:
    """Release or cancel (`action`) the job `name`, for a caller who acts on its team; 409
    once it has ended."""
    jobs = await jobs_client(request)
    caller.check_acts_on(await team_of_job(jobs, name), f"job {name!r}")
    handle = jobs.job(name)
    try:
        await (handle.release() if action == "release" else handle.cancel())
    except JobNotFound:  # it exists (its team was read): it has ended
        raise HTTPException(409, f"job {name!r} has ended already") from None
    except GpuprovError as error:
        raise HTTPException(409, str(error)) from None


def _add_ending(app: FastAPI, action: str) -> None:
    async def ending(
        request: Request, name: JobName, caller: Annotated[Caller, Depends(require_member)]
    ) -> Ended:
        await end_job(request, caller, name, action)
        return Ended(name=name, requested=action)

    app.post(
        f"/v1/jobs/{{name}}/{action}",
        responses={
            **ROLE_REFUSALS,
            **NO_TEMPORAL,
            **NO_JOB,
            409: {"description": "the job has ended already"},
        },
        name=f"{action}_job",
    )(ending)
