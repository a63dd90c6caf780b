"""WatchWorkers: one liveness sweep, started by the Temporal Schedule "gpuprov-liveness"
(gpuprov/engine/schedules.py) every `[workers] sweep_every_seconds`. Deterministic only.

Its one step, `sweep_liveness` (activities/liveness.py), marks the workers that missed their
heartbeats for `lost_after_seconds` lost and sends `workers_changed` to the job of every worker
whose liveness or health changed since that job was last told. A sweep that fails for good fails
this run; the next one starts over (nothing is lost: a change stays pending until told).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.errors import StepFailure
    from activities.liveness import LivenessActivities, SweepInput, SweepReport
    from gpuprov import contract
    from gpuprov.contract import WatchInput
    from workflows.steps import run_step


@workflow.defn(name=contract.WATCH_WORKERS)
class WatchWorkers:
    @workflow.run
    async def run(self, request: WatchInput) -> SweepReport:
        try:
            report: SweepReport = await run_step(
                LivenessActivities.sweep_liveness,
                SweepInput(lost_after_seconds=request.lost_after_seconds),
            )
        except StepFailure as failure:
            raise ApplicationError(
                f"liveness sweep failed: {failure}", type="SweepFailed", non_retryable=True
            ) from None
        workflow.set_current_details(
            f"{len(report.lost)} lost, {len(report.signalled)} job(s) told, "
            f"{len(report.skipped)} closed, {len(report.errors)} not delivered"
        )
        return report
