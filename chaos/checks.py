"""The checks every chaos run makes (see docs/reliability.md, "What is checked"), from the
final statuses and the cloud's ledger after the reconcile pass, and what each job left live."""

from __future__ import annotations

from typing import Any

from chaos.nodes import Interval
from chaos.report import Check, JobOutcome, ResolvedOrphan, Summary


def leftovers(
    names: list[str], before: dict[str, Any], orphan_vms: list[str], after: dict[str, Any]
) -> dict[str, list[str]]:
    """job -> what it left live: a machine or side resource live before the reconcile pass with
    no orphan record naming it (its teardown missed it and did not say so), or anything live
    after the pass."""
    recorded = set(orphan_vms)
    left: dict[str, list[str]] = {}
    for when, ledger in (("before the pass", before), ("after the pass", after)):
        for vm in sorted(set(ledger["live_vms"]) | set(ledger["side_vms"])):
            if when == "before the pass" and vm in recorded:
                continue
            job = job_of(vm)
            if job in names:
                left.setdefault(job, []).append(f"{vm} live {when}")
    return left


def standard_checks(
    summary: Summary,
    after: dict[str, Any],
    unrecorded: list[str],
    last_seen: dict[str, str],
    epoch_start: float,
) -> None:
    """The checks every run makes (appended to `summary.checks`), and the findings worth
    reading beside them."""
    checks = summary.checks
    jobs = {job.name: job for job in summary.jobs}
    open_jobs = [job for job in summary.jobs if job.state in ("open", "not submitted")]
    odd = [job for job in summary.jobs if job.state in ("terminated", "timed_out")]
    states = summary.states()
    checks.append(
        Check(
            "every job reached a terminal state",
            not open_jobs and not odd,
            f"{len(summary.jobs) - len(open_jobs)}/{len(summary.jobs)} ("
            + ", ".join(f"{s} {n}" for s, n in sorted(states.items()))
            + ")",
            [
                f"seed {summary.seed}: {job.name} still {job.state} "
                f"(last: {last_seen.get(job.name)}; waiting for: {job.waiting_for}); "
                f"faults: {job.faults or 'none'}"
                for job in open_jobs
            ]
            + [f"{job.name} ended {job.state} (the harness never does that)" for job in odd],
        )
    )
    creates: dict[str, int] = after["creates"]
    summary.vms = len(creates)
    summary.creates_max = max(creates.values(), default=0)
    duplicates = {vm: n for vm, n in creates.items() if n != 1}
    rows = after["rows"]
    checks.append(
        Check(
            "creates per VM identity (must be exactly 1)",
            not duplicates,
            f"{len(creates)} VM identities, "
            + (f"{len(duplicates)} with more than one create" if duplicates else "all 1"),
            [
                f"seed {summary.seed}: VM {vm} created {n} times: "
                + ", ".join(
                    f"{r.id} at t+{r.created_at - epoch_start:.1f}s ({r.boot_mode})"
                    for r in rows
                    if r.vm == vm
                )
                + f"; job {job_of(vm)} faults: {jobs.get(job_of(vm), _no_job()).faults}"
                for vm, n in sorted(duplicates.items())
            ],
        )
    )
    checks.append(
        Check(
            "live instances after release and one reconcile pass (must be 0)",
            not summary.live_after,
            f"{len(summary.live_after)} (before the pass: {len(summary.live_before_reconcile)})",
            [f"seed {summary.seed}: {line}" for line in summary.live_after],
        )
    )
    checks.append(
        Check(
            "live side resources after one reconcile pass (must be 0)",
            not summary.side_after,
            f"{len(summary.side_after)} (before the pass: {len(summary.side_before_reconcile)})",
            [f"seed {summary.seed}: {line}" for line in summary.side_after],
        )
    )
    ran = summary.reconcile.startswith("ran")
    checks.append(
        Check(
            "open orphans after one reconcile pass (must be 0)",
            ran and not summary.orphans_after,
            (f"{len(summary.orphans_after)}" if ran else summary.reconcile)
            + f" (before the pass: {len(summary.orphans_before_reconcile)})",
            [f"seed {summary.seed}: {line}" for line in summary.orphans_after]
            + ([] if ran else [summary.reconcile]),
        )
    )
    checks.append(
        Check(
            "disruptions done as planned (worker SIGKILLs, dev server restarts >= 1)",
            summary.kills_done == summary.kills_requested
            and summary.restarts_done == summary.restarts_requested
            and summary.restarts_done >= 1,
            f"kills {summary.kills_done}/{summary.kills_requested}, "
            f"server restarts {summary.restarts_done}/{summary.restarts_requested}",
        )
    )
    checks.append(
        Check(
            "machines live with no orphan record when every job had ended (must be 0)",
            not unrecorded,
            f"{len(unrecorded)} (a listing reconciler is the only one that could find them)",
            [
                f"seed {summary.seed}: {vm}: job {job.name} ended {job.state}, "
                f"leaks {job.leaks or 'none'}, faults {job.faults or 'none'}"
                for vm in unrecorded
                for job in [jobs.get(job_of(vm), _no_job())]
            ],
        )
    )
    checks.append(
        Check(
            "work rows still open when every job had ended (must be 0)",
            not summary.open_work,
            f"{len(summary.open_work)}",
            [f"seed {summary.seed}: {line}" for line in summary.open_work],
        )
    )
    mid_step = [job for job in summary.jobs if "creates in flight" in job.role]
    if mid_step:
        timed_out = [j for j in mid_step if "provisioning timed out" in (j.error or "")]
        odd_end = [j for j in mid_step if j.state not in ("failed", "completed")]
        checks.append(
            Check(
                "timeouts that land while creates are in flight: each job ended by its timeout",
                not odd_end,
                f"{len(mid_step)} job(s): {len(timed_out)} timed out with their creates in "
                f"flight, {len(mid_step) - len(timed_out)} ended otherwise first",
                [f"seed {summary.seed}: {j.name} ended {j.state}" for j in odd_end],
            )
        )
    hedged = [job for job in summary.jobs if job.role.startswith("lease; hedged")]
    if hedged:
        checks.append(_hedged_check(hedged, summary.seed))
    waiting = [job for job in summary.jobs if job.role.startswith("lease; waits")]
    if waiting:
        checks.append(_waiting_check(waiting, summary.seed))
    # Findings: worth reading, not fatal by themselves.
    for job in summary.jobs:
        if job.cancel and job.cancel.startswith("sent") and job.state == "failed":
            summary.findings.append(
                f"{job.name} was cancelled ({job.cancel}) but ended failed, not cancelled: "
                f"{_first_line(job.error)}"
            )
    leaky = [job for job in summary.jobs if job.leaks]
    if leaky:
        summary.findings.append(
            f"{len(leaky)} job(s) reported teardown leaks (each should be an orphan record "
            "that the reconcile pass resolves): "
            + "; ".join(f"{job.name} ({job.state}): {' / '.join(job.leaks)}" for job in leaky)
        )


def _hedged_check(hedged: list[JobOutcome], seed: int) -> Check:
    """A hedged job that got its GPUs got them from the hedge: its hung first attempt lost
    the race (torn down: the leak checks above say whether it is gone), never won it."""
    placed = [job for job in hedged if job.state == "completed" and job.attempts]
    raced = [job for job in placed if "lost_race" in job.attempts[0]]
    wrong = [job for job in placed if not _ended_apart_from_winning(job.attempts[0])]
    return Check(
        "hedged jobs: a hung first attempt loses its race and is torn down",
        not wrong,
        f"{len(hedged)} job(s): {len(placed)} got their GPUs, {len(raced)} of them by winning "
        f"a race against the hung attempt, the others after it failed first "
        f"({len(hedged) - len(placed)} ended otherwise)",
        [f"seed {seed}: {job.name}'s first attempt: {job.attempts[0]}" for job in wrong],
    )


def _ended_apart_from_winning(attempt: str) -> bool:
    """The first attempt (hung for good) lost its race or failed; it cannot have won."""
    return ": succeeded" not in attempt and ": in_progress" not in attempt


def _waiting_check(waiting: list[JobOutcome], seed: int) -> Check:
    """A job whose offers sold out waits for capacity: it never fails because every offer
    sold out once (only its deadline, a cancel or another fault ends it so)."""
    gave_up = [
        job
        for job in waiting
        if "every offer failed" in (job.error or "")
        and all(_sold_out(a) for a in job.attempts if not a.endswith(": succeeded"))
    ]
    waited = [job for job in waiting if sum(1 for a in job.attempts if _sold_out(a)) > 3]
    placed = [job for job in waited if job.state == "completed"]
    return Check(
        "waiting jobs: sold out on every offer, each waits for capacity instead of failing",
        not gave_up,
        f"{len(waiting)} job(s): {len(waited)} tried an offer again after a wait, "
        f"{len(placed)} of them then got their GPUs",
        [f"seed {seed}: {job.name} gave up: {job.error}" for job in gave_up],
    )


def _sold_out(attempt: str) -> bool:
    return ": Capacity at " in attempt or ": Quota at " in attempt


def overlapping_runs(
    intervals: dict[str, list[Interval]], planned: int, seed: int, epoch_start: float
) -> Check:
    """For every job that runs, no two of its epochs' works ran at once (each work's interval:
    chaos/nodes.py); and, after each node cut off while it ran its work, how long before the
    next epoch started that node's work had stopped. `planned`: partitioned nodes planned."""
    problems, margins = [], []
    cut = 0
    for job, spans in sorted(intervals.items()):
        for old in spans:
            later = [span for span in spans if span.epoch > old.epoch]
            cut += old.cut
            if later and old.cut and old.end is not None:
                margins.append(min(span.start for span in later) - old.end)
            for new in later:
                common = old.overlaps(new)
                if common > 0:
                    ended = "no end known" if old.end is None else f"t+{old.end - epoch_start:.1f}s"
                    problems.append(
                        f"seed {seed}: {job}: epoch {old.epoch} node {old.rank} ({old.how}, "
                        f"ran until {ended}) and epoch {new.epoch} node {new.rank} (started "
                        f"t+{new.start - epoch_start:.1f}s) ran {common:.1f}s at once"
                    )
    several = [job for job, spans in intervals.items() if len({s.epoch for s in spans}) > 1]
    works = sum(len(spans) for spans in intervals.values())
    spread = f"{min(margins):+.1f}s" if margins else ""
    if margins and max(margins) != min(margins):
        spread += f" to {max(margins):+.1f}s"
    waited = (
        f"; the next epoch started {spread} after such a node's work had stopped (its lease "
        "and grace over, or its machine gone; negative: before)"
        if margins
        else ""
    )
    return Check(
        "overlapping runs: no two epochs of a job ran at once (must be 0)",
        not problems,
        f"{len(problems)} over {len(several)} job(s) that ran more than one epoch ({works} "
        f"node runs in {len(intervals)} job(s)); partitioned nodes: {planned} planned, {cut} "
        f"cut off while running their work{waited}",
        problems,
    )


def resolved_orphans(
    open_before: list[str], open_after: set[str], before: dict[str, Any], after: dict[str, Any]
) -> list[ResolvedOrphan]:
    """Each orphan record the pass closed, with what the ledger showed of its VM before and
    after the pass."""
    return [
        ResolvedOrphan(
            vm=vm,
            machines_before=tuple(before["live_ids"].get(vm, ())),
            side_before=vm in before["side_vms"],
            gone_after=vm not in after["live_vms"] and vm not in after["side_vms"],
        )
        for vm in open_before
        if vm not in open_after
    ]


def _first_line(text: str | None) -> str:
    return (text or "no error recorded").strip().splitlines()[0][:300]


def job_of(vm: str) -> str:
    """`chaos-0007-a1-n0-abc123` -> `chaos-0007`."""
    return vm.split("-a", 1)[0] if vm.startswith("chaos-") else vm


def _no_job() -> JobOutcome:
    return JobOutcome(name="(unknown)", nodes=0, state="unknown", faults=[])
