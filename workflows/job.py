"""ProvisionJob: one job's life, top to bottom. Deterministic only.

1. accept: the input is a valid job spec whose name matches the workflow id (job-<name>), or
   the workflow fails at once naming the field, before any side effect (workflows/intake.py);
2. admission and existing workers: one local activity admits the job by its team (refused,
   naming why: an unknown team, an unknown secret in `env`, the team's GPU limit; it answers
   what is left of the team's monthly budget, which every offer is held against:
   workflows/budget.py), reads the providers' capabilities and the shared blocks and reserves
   idle, compatible existing workers for every node (all or none);
3. provision, when it got none (workflows/provisioning.py): plan, rank, try offers as saga
   attempts within `provisioning_timeout_seconds`, failing over per gpuprov/policy.py;
4. placed: the k3s profile where the spec asks for it; the job's workers busy, its VM rows
   running; the job is `ready`;
5. serve: a lease (no `run`) waits for `release`; a job with `run` gives every node its work and
   is `running` until the work ends everywhere (workflows/running.py). A node lost or reclaimed
   meanwhile blocks its offer, tears the attempt down and places the job again, up to
   `recovery.max_restarts`. Either way the job wakes on `workers_changed` (a signal that only
   says "look again": it then reads the database), on its health-check interval and on
   `max_runtime_seconds`, and under a budget on its team's spend check (past the budget:
   released, or warned, by the team's `on_exceed`); a long-lived job continues as new before
   its history grows large;
6. release: stop the work, terminate and confirm gone (or keep); workers revoked, existing ones
   freed.
Cancellation at any moment still unwinds. State changes, attempts, failovers and time to ready
are counted in workflows/metrics.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    import workflows.budget as budget
    import workflows.metrics as metrics
    import workflows.profile as profile
    import workflows.report as report
    import workflows.running as running
    import workflows.teardown as teardown
    from activities.errors import StepFailure
    from activities.health import HealthActivities, NodesHealthInput
    from activities.job_context import ContextInput, JobContextActivities
    from activities.liveness import JobWorkersInput, LivenessActivities
    from activities.store import (
        PlacedInput,
        ReleaseInput,
        ReserveInput,
        StoreActivities,
        VmStatusInput,
    )
    from activities.teams import Admission, AdmitInput, SpendInput, TeamActivities
    from activities.work import AssignInput, EpochInput, WorkActivities
    from gpuprov import contract
    from gpuprov.contract import HealthInput, vm_run_tag
    from gpuprov.models import (
        AttemptOutcome,
        Block,
        BlockScope,
        JobSpecError,
        JobState,
        JobStatus,
        NodeInstance,
        ReleasePolicy,
        Restart,
    )
    from providers.base import Capabilities
    from providers.errors import ErrorKind
    from workflows.compensation import (
        Compensation,
        CompensationStack,
        unwind_surviving_cancellation,
    )
    from workflows.failures import JobFailed
    from workflows.intake import NO_INPUT, JobCarry, accept_carry, accept_job_spec, job_name_of
    from workflows.provisioning import Provisioning, ProvisioningChanges
    from workflows.running import gpus_of
    from workflows.steps import run_step

# A run's history is handed over to a new run (continue-as-new) past this many events; Temporal
# warns at 10,240 and stops a run at 51,200.
MAX_EVENTS_PER_RUN = 8_000
# How long a stop waits for every node to report its work ended (SIGTERM, the agent's grace
# period, SIGKILL) before the teardown goes ahead anyway.
STOP_WAIT = timedelta(seconds=90)
STOP_RECHECK = timedelta(seconds=5)
RELEASED = "released (`release`)"  # JobStatus.ended_because after the `release` signal
# Changes behind `workflow.patched` (docs/architecture.md, "Changing workflow code safely"):
# the job's unwind sees the winning attempt's nodes when a cancel lands as that attempt ends;
UNWIND_PROVISIONED_ON_CANCEL = "unwind-provisioned-on-cancel"
# work handed to the nodes is stopped and closed at every ending, even before its state was read;
STOP_ASSIGNED_WORK = "stop-assigned-work"
# a restart fences: the new attempt's work waits out the old nodes' leases, and a reclaimed
# node's work is given its stop (its last minutes to checkpoint) before the teardown.
FENCED_RESTART = "fenced-restart"


class NodeLost(Exception):
    """Internal: a node of the running job was lost or reclaimed."""

    def __init__(self, lost: running.Lost) -> None:
        super().__init__(lost.cause)
        self.reclaimed = lost.reclaimed


@workflow.defn(name=contract.PROVISION_JOB)
class ProvisionJob:
    def __init__(self) -> None:
        info = workflow.info()
        # The run every row this job writes belongs to, and the only one it reads: a name
        # submitted again is a new run and starts clean (gpuprov/store/runs.py).
        self._run = vm_run_tag(info.first_execution_run_id)
        self._status = JobStatus(name=job_name_of(info.workflow_id), run=self._run)
        self._release_requested = False
        self._changed = False  # `workers_changed` arrived: read the nodes' state again
        self._capabilities: dict[str, Capabilities] = {}
        self._stack = CompensationStack()
        self._prefetched_blocks: list[Block] | None = None  # for the first plan only
        self._provisioning: Provisioning | None = None
        self._changes = ProvisioningChanges()  # decided as the run starts
        self._epoch = 0  # the run's restarts so far: each epoch's work rows are its own
        self._next_check: datetime | None = None
        self._work_assigned = False  # this run handed the current epoch's work to the nodes
        self._admission: Admission | None = None  # by the job's team, at its first placement
        self._next_budget_check: datetime | None = None

    @workflow.query(name=contract.JOB_STATUS)
    def status(self) -> JobStatus:
        return self._status

    @workflow.signal(name=contract.JOB_RELEASE)
    def release(self) -> None:
        self._release_requested = True

    @workflow.signal(name=contract.JOB_WORKERS_CHANGED)
    def workers_changed(self) -> None:
        """Something about a node changed in the database: look again. Anyone who can reach
        Temporal may send it; it changes nothing by itself."""
        self._changed = True

    @workflow.run
    async def run(self, raw: RawValue = NO_INPUT) -> JobStatus:
        carry = self._accept(raw)
        # After the input is accepted (a rejected start fails with no command at all) and
        # before any command: the run's first activation (ProvisioningChanges).
        self._changes = ProvisioningChanges.decide()
        if self._provisioning is not None:  # a continued run's, made by _accept
            self._provisioning.changes = self._changes
        if carry is None and self._changes.teams:
            self._tag_team()
        try:
            if carry is None:
                await self._place()
            await self._serve()
            await self._release()
            self._set_state(JobState.COMPLETED)
            return self._status
        except asyncio.CancelledError:
            if self._status.state in (JobState.QUEUED, JobState.PROVISIONING):
                metrics.provisioning_seconds("cancelled")
            self._status.ended_because = "cancelled"
            self._set_state(JobState.RELEASING, "teardown after cancellation")
            await self._stop_work()
            await self._abandon_stray_work()
            await self._unwind()
            await self._free_workers()
            self._set_state(JobState.CANCELLED)
            raise
        except (JobFailed, StepFailure) as failure:
            # A StepFailure here is a bookkeeping step (the database) that failed for good
            # outside any attempt: the policy fails the job, which releases what it holds.
            if self._status.state in (JobState.QUEUED, JobState.PROVISIONING):
                metrics.provisioning_seconds("failed")
            await self._stop_work()
            await self._abandon_stray_work()
            await self._unwind()  # nothing is left by now unless placed; kept as a guarantee
            await self._free_workers()
            self._fail(str(failure))
            raise ApplicationError(str(failure), type="JobFailed", non_retryable=True) from None

    # ------------------------------------------------------------------ 1. accept

    def _accept(self, raw: RawValue) -> JobCarry | None:
        """The job spec (or, in a continued run, the state carried over), or the workflow
        fails now: nothing has happened yet to undo."""
        info = workflow.info()
        try:
            if info.continued_run_id is not None:
                carry = accept_carry(raw, info.workflow_id, workflow.payload_converter())
                self._resume(carry)
                return carry
            self._spec = accept_job_spec(raw, info.workflow_id, workflow.payload_converter())
        except JobSpecError as invalid:
            self._fail(str(invalid))
            raise ApplicationError(
                str(invalid), type="InvalidJobSpec", non_retryable=True
            ) from None
        self._complete_start_attributes()
        self._status.team = self._spec.team
        metrics.job_state(JobState.QUEUED)
        return None

    def _complete_start_attributes(self) -> None:
        """`GpuprovClient.submit` sets the state (queued) and the GPU at start, at no cost in
        events; a job started another way (the temporal CLI, another SDK) gets them here."""
        present = workflow.info().typed_search_attributes
        missing = []
        if present.get(contract.STATE) is None:
            missing.append(contract.STATE.value_set(JobState.QUEUED.value))
        gpu = self._spec.resources.gpu
        if gpu and present.get(contract.GPU) is None:
            missing.append(contract.GPU.value_set(gpu))
        if missing:
            workflow.upsert_search_attributes(missing)

    def _tag_team(self) -> None:
        """`GpuprovTeam`, set by `GpuprovClient.submit` at start; a job started another way
        gets it here, so that the temporal CLI and UI can filter every job by its team."""
        if workflow.info().typed_search_attributes.get(contract.TEAM) is None:
            workflow.upsert_search_attributes([contract.TEAM.value_set(self._spec.team)])

    def _resume(self, carry: JobCarry) -> None:
        """A continued run takes over its predecessor's state; the machines it holds get their
        teardown pushed again (in node order, so the unwind runs as it would have)."""
        self._spec, self._status, self._epoch = carry.spec, carry.status, carry.epoch
        self._capabilities = carry.capabilities
        self._admission = carry.admission
        self._release_requested = self._release_requested or carry.release_requested
        for node in self._status.live_nodes():
            if node.status != "kept":
                self._push_retire(node)
        if self._status.attempts:  # provisioned: a restart provisions again
            self._provisioning = Provisioning(
                self._spec,
                self._status,
                self._capabilities,
                self._waiting,
                self._record_leak,
                stack=self._stack,
                admission=carry.admission,
            )

    def _push_retire(self, node: NodeInstance) -> None:
        hints = self._capabilities[node.provider]
        self._stack.push(
            Compensation(
                name=f"tear down {node.vm}",
                run=lambda: teardown.retire(node, hints),
                group=f"attempt {node.attempt}",
            )
        )

    # ------------------------------------------------------------------ 2-4. place

    async def _place(self) -> None:
        """Existing workers, else a provisioned attempt; then the profile and the records."""
        first = self._status.ready_at is None
        if await self._reserve_existing_workers():
            outcome = "existing_worker"
        else:
            await self._provision()
            outcome = "provisioned"
        if first:
            metrics.provisioning_seconds(outcome)
        await self._set_up_profile()
        await self._mark_placed()
        if first:
            self._status.ready_at = workflow.now()
        self._set_state(JobState.READY, "release: signal `release` or cancel the workflow")

    async def _reserve_existing_workers(self) -> bool:
        """One local activity: the providers' capabilities and the shared blocks for the first
        plan, then idle, compatible existing workers reserved for every node (none for the
        k3s profile, which installs over SSH on machines the job provisions). The job stays
        queued until it tries an offer."""
        k3s = self._spec.profile == "k3s"
        reserve = None
        if not k3s:
            reserve = ReserveInput(
                job=self._spec.name,
                request=self._spec.resource_request(),
                nodes=self._spec.nodes,
                run=self._run,
            )
        self._waiting(
            "offers (the k3s profile provisions)" if k3s else "an idle, compatible existing worker"
        )
        admit = None
        if self._changes.teams and self._admission is None:
            admit = AdmitInput(
                team=self._spec.team,
                job=self._spec.name,
                run=self._run,
                nodes=self._spec.nodes,
                gpus_per_node=self._spec.resources.gpus_per_node if self._spec.resources.gpu else 0,
                now=workflow.now(),
                secrets=self._spec.secret_references(),
            )
        context = await run_step(
            JobContextActivities.job_context,
            ContextInput(reserve=reserve, job=self._spec.name, run=self._run, admit=admit),
        )
        if context.admission is not None:
            if context.admission.refused is not None:
                raise JobFailed(context.admission.refused)
            self._admission = context.admission
        self._status.existing_workers = context.reserved  # freed by _free_workers at any ending
        self._capabilities = context.capabilities
        self._prefetched_blocks = context.blocks
        return bool(context.reserved)

    async def _provision(self) -> None:
        self._provisioning = Provisioning(
            self._spec,
            self._status,
            self._capabilities,
            self._waiting,
            self._record_leak,
            prefetched_blocks=self._prefetched_blocks,
            changes=self._changes,
            admission=self._admission,
        )
        self._prefetched_blocks = None
        try:
            await self._provisioning.within_timeout()
        except asyncio.CancelledError:
            # A cancel that lands as the winning attempt finishes finds its nodes up and its
            # compensations on the attempt's stack: the job's unwind must see them (an attempt
            # cancelled midway has undone its own stack already, so this adds nothing then).
            if workflow.patched(UNWIND_PROVISIONED_ON_CANCEL):
                self._stack = self._provisioning.stack
            raise
        except JobFailed:
            # The deadline that lands after an attempt handed its nodes over (a race's losers
            # still being torn down, its records being written) must unwind them too.
            if self._changes.unwind_winner_at_deadline:
                self._stack = self._provisioning.stack
            raise
        self._stack = self._provisioning.stack  # the winning attempt's: undone at release
        self._capabilities = self._provisioning.capabilities

    async def _set_up_profile(self) -> None:
        """`profile: k3s`: node 0 runs the k3s server, the others join it."""
        if self._spec.profile == "k3s":
            machines = self._placed_machines()
            self._waiting(f"k3s: server and {len(machines) - 1} agent(s) on the nodes")
            self._status.kubeconfig = await profile.set_up_k3s(machines)

    async def _mark_placed(self) -> None:
        """The job runs now: its workers are busy, its machines' rows say running."""
        placed = self._status.live_nodes()
        await run_step(
            StoreActivities.mark_placed,
            PlacedInput(
                job=self._spec.name,
                vms=[node.vm for node in placed],
                worker_ids=[
                    *(node.worker_id for node in placed if node.worker_id),
                    *(worker.worker_id for worker in self._status.existing_workers),
                ],
            ),
        )

    def _placed_machines(self) -> list[NodeInstance]:
        return [node for node in self._status.live_nodes() if node.status == "running"]

    # ------------------------------------------------------------------ 5. serve

    async def _serve(self) -> None:
        if self._spec.run is None:
            await self._serve_lease()
            return
        while True:
            try:
                await self._run_epoch()
                return
            except NodeLost as lost:
                await self._restart(str(lost), reclaimed=lost.reclaimed)

    async def _serve_lease(self) -> None:
        """Ready until `release` or `max_runtime_seconds`, watching the machines' health."""
        while not await self._should_end():
            await self._look()
            self._continue_as_new_if_long()

    async def _run_epoch(self) -> None:
        """Give every node its work (again, in a continued run: a repeat changes nothing) and
        follow it until it ends everywhere, the job is released, or a node is lost."""
        epoch = self._epoch_input()
        nodes = self._placed_nodes()
        if not await self._old_leases_waited_out():
            return  # released meanwhile: nothing was handed out
        self._work_assigned = True  # before the step: a cancel may land while it commits
        await run_step(
            WorkActivities.assign_work,
            AssignInput(
                job=self._spec.name,
                epoch=self._epoch,
                assignments=running.assignments(self._spec, nodes, attempt=self._epoch + 1),
                run=self._run,
            ),
            # The nodes start what this writes: never from a workflow task that may be lost.
            remote=self._changes.assign_work_as_task,
        )
        self._set_state(JobState.RUNNING, f"the work to end on {len(nodes)} node(s)")
        self._changed = True  # read the nodes' state once before the first wait
        while not await self._should_end():
            self._status.work = await run_step(WorkActivities.work_state, epoch)
            await self._look()
            judgement = running.judge(
                self._status.work, self._status.health, running.lost(self._status.workers)
            )
            if isinstance(judgement, running.Completed):
                self._status.ended_because = "the work ended on every node"
                return
            if isinstance(judgement, running.Failed):
                await self._stop_work()
                self._status.error = judgement.message
                await self._release()
                raise JobFailed(judgement.message)
            if isinstance(judgement, running.Lost):
                raise NodeLost(judgement)
            self._continue_as_new_if_long()
        await self._stop_work()

    async def _old_leases_waited_out(self) -> bool:
        """After a restart, wait (the new attempt is placed already) until no old node can
        still run its work; False when the job is released meanwhile."""
        until = self._status.work_waits_until
        if until is not None and workflow.now() < until:
            self._waiting(
                f"the old attempt's nodes' leases to lapse (until {until.isoformat()}): "
                "an old node that may still run the work has stopped it by then"
            )
            wait = (until - workflow.now()).total_seconds()
            await _until(lambda: self._release_requested, wait)
        self._status.work_waits_until = None
        if self._release_requested:
            self._status.ended_because = self._status.ended_because or RELEASED
        return not self._release_requested

    def _epoch_input(self) -> EpochInput:
        return EpochInput(job=self._spec.name, epoch=self._epoch, run=self._run)

    def _placed_nodes(self) -> list[running.PlacedNode]:
        return running.placed_nodes(self._placed_machines(), self._status.existing_workers)

    async def _should_end(self) -> bool:
        """Wait for news: `release`, `workers_changed`, the next health check or the runtime
        limit. True when the job should end now (released, or past its runtime)."""
        if not self._changed and not self._release_requested:
            await _until(lambda: self._changed or self._release_requested, self._until_next_wake())
        self._changed = False  # what follows reads the state; a signal from now on is news
        if self._release_requested:
            self._status.ended_because = self._status.ended_because or RELEASED
            return True
        if await self._past_budget():
            return True
        limit = self._spec.max_runtime_seconds
        ready_at = self._status.ready_at
        if limit and ready_at and workflow.now() >= ready_at + timedelta(seconds=limit):
            self._status.ended_because = (
                f"max_runtime_seconds ({limit}s) reached at {workflow.now().isoformat()}, "
                f"counted from the first ready at {ready_at.isoformat()}"
            )
            self._waiting(f"release: max_runtime_seconds ({limit}s) reached")
            return True
        return False

    def _budget_checked(self) -> bool:
        """The job reads its team's spend while it holds machines: its team has a budget."""
        admission = self._admission
        return admission is not None and admission.monthly_budget_usd is not None

    async def _past_budget(self) -> bool:
        """When the spend check is due: True when the team is past its monthly budget and its
        `on_exceed` releases the job (it says why); past it with `warn`, a warning, once."""
        due = self._next_budget_check
        if not self._budget_checked() or due is None or workflow.now() < due:
            return False
        admission = self._admission
        assert admission is not None
        spend = await run_step(
            TeamActivities.team_spend, SpendInput(team=admission.team, now=workflow.now())
        )
        self._next_budget_check = workflow.now() + timedelta(seconds=admission.check_seconds)
        if not budget.over_budget(spend):
            return False
        message = budget.exceeded_message(spend)
        if spend.on_exceed == "release":
            self._status.ended_because = f"released: {message}"
            self._waiting(f"release: {message}")
            return True
        if not any(warning.startswith(message.split(":")[0]) for warning in self._status.warnings):
            self._status.warnings.append(f"{message}; allowed on")
            self._publish_details()
        return False

    def _until_next_wake(self) -> float | None:
        now = workflow.now()
        wakes = []
        if self._budget_checked():
            assert self._admission is not None
            if self._next_budget_check is None:
                self._next_budget_check = now + timedelta(seconds=self._admission.check_seconds)
            wakes.append(self._next_budget_check)
        interval = self._spec.health_check_interval_seconds
        if interval and (self._placed_machines() or self._spec.run is not None):
            if self._next_check is None:
                self._next_check = now + timedelta(seconds=interval)
            wakes.append(self._next_check)
        limit = self._spec.max_runtime_seconds
        if limit is not None and self._status.ready_at is not None:
            wakes.append(self._status.ready_at + timedelta(seconds=limit))
        if not wakes:
            return None
        return max(1.0, (min(wakes) - now).total_seconds())

    async def _look(self) -> None:
        """After a wake: the workers' liveness as the database says it (the heartbeats' truth),
        the machines' health when a check is due, then the details."""
        self._status.workers = await run_step(
            LivenessActivities.job_workers, JobWorkersInput(job=self._spec.name, run=self._run)
        )
        due = self._next_check is not None and workflow.now() >= self._next_check
        if not due:
            self._publish_details()
            return
        machines = self._placed_machines()
        if machines:
            checks = [HealthInput(vm=node.vm, expected_gpus=gpus_of(node)) for node in machines]
            self._status.health = await run_step(
                HealthActivities.check_nodes,
                NodesHealthInput(checks=checks),
                summary=f"health of {len(checks)} node(s)",
            )
        interval = self._spec.health_check_interval_seconds or 0
        self._next_check = workflow.now() + timedelta(seconds=interval)
        self._publish_details()

    async def _restart(self, cause: str, reclaimed: bool = False) -> None:
        """A node was lost while the work ran: give the epoch up, block the offer, tear the
        attempt down and revoke its workers (so its work can never report again), then place
        the job anew and run the work from the start, once every old node that may still run
        it is past its lease (`work_waits_until`). A reclaimed node's work is stopped first,
        boundedly: the agent gave it SIGTERM and the notice, and it may be checkpointing."""
        limit = self._spec.recovery.max_restarts
        if self._provisioning is None:
            # An existing worker that went silent cannot be made to stop its work: running the
            # work again elsewhere could run it twice at once.
            raise JobFailed(f"{cause}; a job on existing workers is not restarted")
        if len(self._status.restarts) >= limit:
            # The attempt that lost its node failed, whatever comes next (status only).
            attempt = self._status.attempts[-1]
            attempt.outcome = AttemptOutcome.FAILED
            attempt.step, attempt.kind, attempt.message = "run", ErrorKind.FAILED, cause
            earlier = "".join(f"; restart {r.number}: {r.cause}" for r in self._status.restarts)
            raise JobFailed(f"{cause}; no restart left (recovery.max_restarts {limit}){earlier}")
        self._status.restarts.append(
            Restart(number=len(self._status.restarts) + 1, at=workflow.now(), cause=cause)
        )
        self._waiting(f"restart {len(self._status.restarts)}: {cause}")
        fenced = workflow.patched(FENCED_RESTART)
        if fenced and reclaimed:
            # Its work checkpoints now, at most until the cloud takes the machine.
            await self._stop_work(by=running.taken_back_by(self._status.workers))
        ended = {node.worker_id for node in self._status.work if node.state.final}
        epoch = self._epoch_input()
        await run_step(WorkActivities.abandon_work, epoch)
        attempt = self._status.attempts[-1]
        attempt.outcome = AttemptOutcome.FAILED
        # A reclaim says the offer has no capacity for now; anything else, that it failed.
        kind = ErrorKind.CAPACITY if fenced and reclaimed else ErrorKind.FAILED
        attempt.step, attempt.kind, attempt.message = "run", kind, cause
        lost = StepFailure("run", kind, cause)
        await self._provisioning.add_block(BlockScope.OFFER, attempt.offer.id, lost)
        await self._unwind()
        await self._free_workers()
        if fenced:
            # Revoked now: their heartbeats write nothing more, so their leases are final.
            workers = await run_step(
                LivenessActivities.job_workers, JobWorkersInput(job=self._spec.name, run=self._run)
            )
            self._status.work_waits_until = running.work_fence(workers, self._status.nodes, ended)
        self._epoch += 1
        self._work_assigned = False
        self._status.work, self._status.health, self._next_check = [], [], None
        await self._place()

    def _continue_as_new_if_long(self) -> None:
        info = workflow.info()
        long = info.get_current_history_length() >= MAX_EVENTS_PER_RUN
        if not long and not info.is_continue_as_new_suggested():
            return
        workflow.continue_as_new(
            JobCarry(
                spec=self._spec,
                status=self._status,
                capabilities=self._capabilities,
                epoch=self._epoch,
                release_requested=self._release_requested,
                admission=self._admission,
            )
        )

    # ------------------------------------------------------------------ 6. release

    async def _stop_work(self, by: datetime | None = None) -> None:
        """Ask the nodes to stop the work (SIGTERM, grace, SIGKILL) and wait, boundedly (and
        no later than `by`), for them to say it ended; the teardown that follows ends what is
        left anyway."""
        if self._spec.run is None:
            return
        if not self._status.work and not (
            self._work_assigned and workflow.patched(STOP_ASSIGNED_WORK)
        ):
            return
        epoch = self._epoch_input()
        try:
            await run_step(WorkActivities.stop_work, epoch)
            deadline = workflow.now() + STOP_WAIT
            if by is not None:
                deadline = min(deadline, by)
            silent = running.unreachable(self._status.workers, self._status.health)
            while workflow.now() < deadline:
                self._changed = False
                self._status.work = await run_step(WorkActivities.work_state, epoch)
                if running.settled([w for w in self._status.work if w.worker_id not in silent]):
                    break
                await _until(lambda: self._changed, STOP_RECHECK.total_seconds())
            # What has not said it ended (a lost node's part) is given up: never started again.
            await run_step(WorkActivities.abandon_work, epoch)
        except StepFailure as failure:
            self._status.leaks.append(f"stopping the work: {failure}")

    async def _abandon_stray_work(self) -> None:
        """A job that ends without having handed its work out (as far as its history says)
        gives up the work rows of its epoch anyway: rows its history does not show, such as
        those a local `assign_work` wrote inside a workflow task that was then lost (how work
        was handed out before `assign-work-as-task`), must not stay open once the job is over.
        Idempotent; nothing to give up is the usual case."""
        if self._spec.run is None or self._work_assigned or not self._changes.abandon_stray_work:
            return
        try:
            await run_step(WorkActivities.abandon_work, self._epoch_input())
        except StepFailure as failure:
            self._status.leaks.append(f"giving up the work: {failure}")

    async def _release(self) -> None:
        self._set_state(JobState.RELEASING, "terminating instances")
        if self._spec.release is ReleasePolicy.KEEP:
            self._stack.discard()  # first: nothing after this may tear the machines down
            for node in self._status.live_nodes():
                node.status = "kept"
                try:
                    await run_step(
                        StoreActivities.mark_vm, VmStatusInput(vm=node.vm, status="kept")
                    )
                except StepFailure as failure:
                    self._status.leaks.append(f"{node.vm} kept but not recorded: {failure}")
            await self._free_workers()
            return
        await self._unwind()
        await self._free_workers()

    async def _unwind(self) -> None:
        await unwind_surviving_cancellation(self._stack, on_failure=self._record_leak)

    def _record_leak(self, compensation: Compensation, failure: StepFailure) -> None:
        self._status.leaks.append(f"{compensation.name}: {failure}")

    async def _free_workers(self) -> None:
        """Existing workers back to idle, managed workers revoked (idempotent). Runs on every
        ending, so it records a failure instead of raising one."""
        try:
            await run_step(
                StoreActivities.release_job_workers,
                ReleaseInput(job=self._spec.name, run=self._run),
            )
        except StepFailure as failure:
            self._status.leaks.append(f"workers of {self._spec.name} not freed: {failure}")

    # ------------------------------------------------------------------ status

    def _fail(self, error: str) -> None:
        self._status.error = error
        self._set_state(JobState.FAILED)

    def _set_state(self, state: JobState, waiting_for: str | None = None) -> None:
        if state is not self._status.state:  # each upsert is a history event
            workflow.upsert_search_attributes([contract.STATE.value_set(state.value)])
            metrics.job_state(state)
        self._status.state = state
        self._status.waiting_for = waiting_for
        self._publish_details()

    def _waiting(self, waiting_for: str) -> None:
        self._status.waiting_for = waiting_for
        self._publish_details()

    def _publish_details(self) -> None:
        workflow.set_current_details(report.current_details(self._status))


async def _until(condition: Callable[[], bool], timeout: float | None) -> None:
    """Wait for `condition`, at most `timeout` seconds (None: as long as it takes)."""
    with contextlib.suppress(TimeoutError):
        await workflow.wait_condition(condition, timeout=timeout)
