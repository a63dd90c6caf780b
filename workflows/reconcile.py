"""Reconcile: the orphan sweeper, started every few minutes by the Temporal Schedule
"gpuprov-reconcile" (gpuprov/engine/schedules.py). Deterministic only.

1. survey (activities/reconcile.py): every machine carrying the gpuprov identity in every
   location in use; keep those that no live job owns (database and Temporal agree) and that are
   older than the grace period, plus the recorded orphans (failed terminations) due for a retry;
2. for each candidate, the teardown a job uses (workflows/teardown.py): delete -> wait until
   observe shows nothing with the identity -> VM row terminated -> clean up its side resources;
3. close its orphan record. A teardown that fails instead bumps the record's attempts and last
   error; the next pass tries again (the Schedule's interval, stretched by the record's backoff).
At most MAX_PARALLEL teardowns run at once; the report says what the pass found and did.

A pass restricted to one job (`ReconcileInput.job`, run by `gpuprov end` once the job's workflow
is terminated) surveys only that job's VM rows and their open orphans, judged the same way; its
report names each machine deleted, found already gone, kept or left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import workflows.teardown as teardown
    from activities.cloud import CloudActivities
    from activities.errors import StepFailure
    from activities.reconcile import Candidate, ReconcileActivities, SurveyInput
    from activities.store import ResolveInput, StoreActivities
    from gpuprov import contract
    from gpuprov.contract import ReconcileInput, ReconcileReport
    from gpuprov.models import NodeInstance
    from providers.base import Capabilities
    from workflows.steps import run_step

MAX_PARALLEL = 10
T = TypeVar("T")
MAX_LINES = 50


@workflow.defn(name=contract.RECONCILE)
class Reconcile:
    def __init__(self) -> None:
        self._report = ReconcileReport()

    @workflow.query(name=contract.RECONCILE_REPORT)
    def report(self) -> ReconcileReport:
        return self._report

    @workflow.run
    async def run(self, request: ReconcileInput) -> ReconcileReport:
        survey = await _must(
            run_step(
                ReconcileActivities.reconcile_survey,
                SurveyInput(
                    grace_seconds=request.grace_seconds,
                    provider=request.provider,
                    job=request.job,
                ),
            )
        )
        report = self._report
        report.found = survey.found
        report.still_open = survey.left_open_count
        report.errors += survey.errors
        report.left_open += survey.left_open
        report.kept_vms += survey.kept_vms
        self._publish(len(survey.candidates))
        if survey.candidates:
            hints = await _must(run_step(CloudActivities.describe_providers))
            for batch in _batches(survey.candidates, MAX_PARALLEL):
                await asyncio.gather(
                    *(self._resolve(c, hints.get(c.location.provider)) for c in batch)
                )
                self._publish(len(survey.candidates))
        return report

    async def _resolve(self, candidate: Candidate, hints: Capabilities | None) -> None:
        """Delete, confirm gone, clean up, close the record; a failure leaves it open."""
        if hints is None:
            self._failed(candidate, f"provider {candidate.location.provider} not enabled")
            return
        location = candidate.location
        node = NodeInstance(
            attempt=candidate.attempt,
            node_index=candidate.node_index,
            vm=candidate.vm,
            provider=location.provider,
            region=location.region,
            zone=location.zone,
            instance_ids=candidate.instance_ids,
            status="leaked",
        )
        try:
            # retire records a failure itself (the orphan's attempts and last error).
            await teardown.retire(node, hints)
        except StepFailure as failure:
            if failure.step == "cleanup":
                self._gone(candidate)  # gone; only its side resources are left
            self._failed(candidate, str(failure))
            return
        self._gone(candidate)
        try:
            await run_step(
                StoreActivities.resolve_orphan, ResolveInput(vm=node.vm, provider=node.provider)
            )
        except StepFailure as failure:
            await _record_failure(node, failure)
            self._failed(candidate, str(failure))
            return
        self._report.resolved += 1

    def _gone(self, candidate: Candidate) -> None:
        """Confirmed gone: deleted if the cloud still showed it, else it was gone already."""
        report = self._report
        if candidate.observed:
            report.deleted += 1
        names = report.deleted_vms if candidate.observed else report.gone_vms
        if len(names) < MAX_LINES:
            names.append(candidate.vm)

    def _failed(self, candidate: Candidate, why: str) -> None:
        self._report.still_open += 1
        if len(self._report.errors) < MAX_LINES:
            self._report.errors.append(f"{candidate.vm}: {why}")

    def _publish(self, candidates: int) -> None:
        report = self._report
        workflow.set_current_details(
            f"**{candidates} candidate(s)**: {report.deleted} deleted, {report.resolved} "
            f"resolved, {report.still_open} still open, {report.found} newly found"
        )


async def _must(step: Awaitable[T]) -> T:
    """A survey or describe that fails for good fails the pass; the next one starts over."""
    try:
        return await step
    except StepFailure as failure:
        raise ApplicationError(
            f"reconcile pass failed: {failure}", type="ReconcileFailed", non_retryable=True
        ) from None


async def _record_failure(node: NodeInstance, failure: StepFailure) -> None:
    """The record failed after the machine was gone and cleaned up: bump the orphan's attempts
    so the next pass closes it. If the database is down too, the record simply stays open."""
    with contextlib.suppress(StepFailure):
        await teardown.record_orphan(node, str(failure))


def _batches(candidates: list[Candidate], size: int) -> Iterator[list[Candidate]]:
    for start in range(0, len(candidates), size):
        yield candidates[start : start + size]
