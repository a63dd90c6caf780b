"""What a job's workflow accepts as its input, checked before it does anything else.

A workflow can be started by anything that reaches Temporal (the `temporal` CLI with raw JSON,
another SDK), not only by `gpuprov submit`. So the job spec arrives raw and is decoded here:
undecodable bytes, a non-object, a missing or invalid field, or a workflow id that is not
`job-<name>` are a `JobSpecError` naming the problem. The workflow then fails at once, before
any side effect, instead of failing its first workflow task forever while the name stays taken
(and a job whose id and name disagree would act on another job's records). Pure functions.

A run started by continue-as-new gets a `JobCarry` instead: the job's state handed over by its
previous run (a job that lives for weeks keeps each run's history short). Only a run that
Temporal itself started as a continuation is read that way; a client cannot start one.
"""

from __future__ import annotations

from pydantic import Field, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.converter import PayloadConverter

from activities.teams import Admission
from gpuprov.models import (
    JobSpec,
    JobSpecError,
    JobStatus,
    format_validation_error,
    parse_job_spec,
    workflow_id_for,
)
from providers.base import Capabilities, Model

# The workflow's input when it was started without one.
NO_INPUT = RawValue(Payload())


def job_name_of(workflow_id: str) -> str:
    """The job's name as its workflow id says it (for the status of a job whose spec failed)."""
    return workflow_id.removeprefix("job-")


class JobCarry(Model):
    """What a job hands to its next run when it continues as new."""

    spec: JobSpec
    status: JobStatus
    capabilities: dict[str, Capabilities] = Field(default_factory=dict)
    epoch: int = Field(default=0, ge=0)  # the run's current epoch (restarts so far)
    release_requested: bool = False
    admission: Admission | None = None  # by the job's team (activities/teams.py)


def accept_carry(raw: RawValue, workflow_id: str, converter: PayloadConverter) -> JobCarry:
    try:
        carry = converter.from_payload(raw.payload, JobCarry)
    except ValidationError as error:
        raise JobSpecError(f"invalid carried job state: {format_validation_error(error)}") from None
    except Exception as error:  # the bytes are not a JSON document
        raise JobSpecError(
            f"the carried job state is not decodable ({type(error).__name__})"
        ) from None
    if workflow_id != workflow_id_for(carry.spec.name):
        raise JobSpecError(f"name: the carried job is not {workflow_id[:100]!r}'s")
    return carry


def accept_job_spec(raw: RawValue, workflow_id: str, converter: PayloadConverter) -> JobSpec:
    if raw.payload == Payload():
        raise JobSpecError("the workflow was started without a job spec")
    try:
        data = converter.from_payload(raw.payload)
    except Exception as error:  # any decoder's failure: the bytes are not a JSON document
        raise JobSpecError(f"the job spec is not decodable JSON ({type(error).__name__})") from None
    spec = parse_job_spec(data)
    if workflow_id != workflow_id_for(spec.name):
        raise JobSpecError(
            f"name: the workflow id {workflow_id[:100]!r} is not {workflow_id_for(spec.name)!r}; a "
            "job's workflow id must be job-<name>"
        )
    return spec
