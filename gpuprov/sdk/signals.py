"""Signals that parts of gpuprov other than the SDK's users send to a job: the liveness sweep
(activities/liveness.py) and the API's work routes (gpuprov/api/work.py) both tell a job that
one of its nodes changed, the same way."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import Client

from gpuprov import contract
from gpuprov.models import workflow_id_for

# One signal must not hold a sweep or a request for long: Temporal's own default is a minute.
SIGNAL_RPC_TIMEOUT = timedelta(seconds=10)


async def tell_workers_changed(client: Client, job: str) -> None:
    """Signal the job `workers_changed` (no payload); an RPCError is Temporal's answer (NOT_FOUND:
    the job is closed or never started)."""
    handle = client.get_workflow_handle(workflow_id_for(job))
    await handle.signal(contract.JOB_WORKERS_CHANGED, rpc_timeout=SIGNAL_RPC_TIMEOUT)
