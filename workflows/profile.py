"""The k3s profile (`profile: k3s`): node 0 runs the k3s server, the others join it as agents
(activities/k3s.py, over SSH; the cluster's join token never leaves the worker). Deterministic."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.k3s import K3sActivities, K3sInput, K3sNode
    from gpuprov.models import NodeInstance
    from workflows.failures import JobFailed
    from workflows.steps import run_step


async def set_up_k3s(machines: list[NodeInstance]) -> str | None:
    """The cluster on the job's machines; where its kubeconfig is ("user@host:/path")."""
    missing = [node.vm for node in machines if node.ssh is None]
    if not machines or missing:
        raise JobFailed(f"the k3s profile needs SSH to every node; none for {missing}")
    cluster = await run_step(
        K3sActivities.setup_k3s,
        K3sInput(
            nodes=[
                K3sNode(vm=node.vm, provider=node.provider, ssh=node.ssh)
                for node in machines
                if node.ssh is not None
            ]
        ),
        summary=f"k3s on {len(machines)} node(s)",
    )
    return cluster.kubeconfig
