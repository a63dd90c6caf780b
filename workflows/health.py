"""CheckHealth: what `gpuprov health JOB|VM` shows, checked on the worker that holds the
credentials and the SSH keys (activities/health.py), one check per VM in parallel."""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.errors import StepFailure
    from activities.health import HealthActivities
    from gpuprov import contract
    from gpuprov.contract import HealthInput, HealthRequest
    from gpuprov.models import HealthReport
    from providers.base import Finding, Severity, Verdict
    from workflows.steps import run_step


async def check(request: HealthInput) -> HealthReport:
    """One VM's report; a check that cannot run says so as a warning (degraded), never hides."""
    try:
        return await run_step(
            HealthActivities.check_health, request, summary=f"health of {request.vm}"
        )
    except StepFailure as failure:
        finding = Finding(severity=Severity.WARN, code="check_failed", message=str(failure))
        return HealthReport(vm=request.vm, verdict=Verdict.DEGRADED, findings=[finding])


@workflow.defn(name=contract.CHECK_HEALTH)
class CheckHealth:
    @workflow.run
    async def run(self, request: HealthRequest) -> list[HealthReport]:
        return list(await asyncio.gather(*(check(item) for item in request.checks)))
