"""What a job's workflow accepts as its input, checked before it does anything else.

A workflow can be started by anything that reaches Temporal (the `temporal` CLI with raw JSON,
another SDK), not only by `gpuprov submit`. So the job spec arrives raw and is decoded here:
undecodable bytes, a non-object, a missing or invalid field, or a workflow id that is not
`job-<name>` are a `JobSpecError` naming the problem. The workflow then fails at once, before
any side effect, instead of failing its first workflow task forever while the name stays taken
(and a job whose id and name disagree would act on another job's records). Pure functions.
"""

from __future__ import annotations

from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.converter import PayloadConverter

from gpuprov.models import JobSpec, JobSpecError, parse_job_spec, workflow_id_for

# The workflow's input when it was started without one.
NO_INPUT = RawValue(Payload())


def job_name_of(workflow_id: str) -> str:
    """The job's name as its workflow id says it (for the status of a job whose spec failed)."""
    return workflow_id.removeprefix("job-")


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
