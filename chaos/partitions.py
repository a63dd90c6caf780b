"""What the partitioned nodes did (chaos/mix.py), read after the run: their agents' leases as
the fake cloud's ledger has them, by job; the overlap check over every job that runs, from when
each of its works ran (chaos/nodes.py `work_intervals`, chaos/checks.py `overlapping_runs`); and,
as a finding, the workers the liveness sweep found lost that were not cut off on purpose."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlmodel import select

from chaos.checks import job_of, overlapping_runs
from chaos.faults import Timings
from chaos.nodes import NodePlayer, work_intervals
from chaos.report import Check, Summary
from gpuprov.store.db import WorkerRecord
from gpuprov.store.records import Records
from providers.fake import FakeCloudState
from providers.fake.state import AgentLease, InstanceRow

if TYPE_CHECKING:
    from chaos.plan import JobRun


def leases_by_job(state_path: str) -> dict[str, list[AgentLease]]:
    """job -> its partitioned machines' agent leases, as the ledger has them now."""
    state = FakeCloudState(state_path)
    try:
        leases = state.agent_leases()
    finally:
        state.close()
    by_job: dict[str, list[AgentLease]] = {}
    for lease in leases:
        by_job.setdefault(job_of(lease.vm), []).append(lease)
    return by_job


def judge_overlaps(
    player: NodePlayer,
    jobs: list[JobRun],
    rows: list[InstanceRow],
    partitions: dict[str, list[AgentLease]],
    timings: Timings,
    seed: int,
    epoch_start: float,
) -> Check:
    """No two epochs of a job ran at once, from when each of its works ran."""
    machines: dict[str, list[InstanceRow]] = {}
    for row in rows:
        machines.setdefault(job_of(row.vm), []).append(row)
    intervals = {
        job: work_intervals(
            player.logs[job],
            machines.get(job, []),
            partitions.get(job, []),
            delete_delay=timings.delete_delay,
            hears_within=timings.heartbeat_interval + timings.stop_grace,
        )
        for job in player.works
    }
    planned = sum(1 for job in jobs if job.role.work and job.role.work.ending == "partition")
    return overlapping_runs(intervals, planned, seed, epoch_start)


def lost_workers(
    records: Records,
    partitions: dict[str, list[AgentLease]],
    machines: list[InstanceRow],
    timings: Timings,
    summary: Summary,
) -> None:
    """How many workers the sweep found lost were partitioned (summary.lost_workers), and a
    finding naming the others, each with what the ledger says of it: its machine deleted first
    (its job's teardown had not revoked it yet: nothing is wrong) or taken back (a killed node,
    whose agent no worker process takes over), its registration lost (the
    fake's agents run in the worker process, and one killed between the API taking the
    registration and the ledger keeping the credential leaves the node's agent dead: the next
    process is refused the spent join token), or silent while its machine ran (an agent starved
    of time, or one no worker process took over after its own died)."""
    cut = {lease.vm for leases in partitions.values() for lease in leases}
    refused = {row.vm for row in machines if row.agent_state == "rejected"}
    taken = {row.vm for row in machines if row.boot_mode == "preempted"}
    deleted = {row.vm: row.deleted_at for row in machines if row.deleted_at is not None}
    with records.db.session() as session:
        lost = session.exec(select(WorkerRecord).where(WorkerRecord.liveness == "lost")).all()
    others = sorted((w for w in lost if w.vm not in cut), key=lambda w: str(w.vm or w.id))
    summary.lost_workers = (len(lost) - len(others), [str(w.vm or w.id) for w in others])
    if not others:
        return
    said: dict[str, list[str]] = {}
    for worker in others:
        vm = worker.vm or ""
        seen = worker.last_seen_at.timestamp() if worker.last_seen_at else None
        if vm in refused:
            why = "registration lost"
        elif vm in taken:
            why = "machine taken back (a killed node)"
        elif vm in deleted and (seen is None or deleted[vm] <= seen + timings.lost_after):
            why = "machine deleted first"
        else:
            why = "silent while its machine ran"
        said.setdefault(why, []).append(str(worker.vm or worker.id))
    summary.findings.append(
        f"{len(others)} worker(s) lost by the liveness sweep (silent for {timings.lost_after:g}s) "
        "that were not partitioned: "
        + "; ".join(f"{why} {len(vms)}: {', '.join(vms[:12])}" for why, vms in sorted(said.items()))
    )
