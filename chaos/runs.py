"""The verdicts on the jobs that run and on the largest job, from their final status, what the
node player saw (chaos/nodes.py) and the cloud's ledger.

Jobs that run:
- every node exited 0 (as the database accepted it): the job ended completed;
- a node exited with a non-zero code: the job ended failed, its error naming the node and code;
- a node was killed with a restart left: the job was placed again on another offer, every node
  started the work exactly twice (once per epoch), and it completed; if placing it again failed
  (a fault), the job failed with its one restart recorded, each node started at most twice;
- a node was killed without a restart left: the job failed, "no restart left", each node having
  started once;
- a node was partitioned (cut off from the API, its machine running on): the liveness sweep
  found its agent silent, and with a restart left the job completed on another offer with that
  one restart, every node having run the second epoch (or, placing it again failed, it failed
  with the restart recorded); without one it failed, "no restart left"; whether the epochs
  overlapped is the overlap check's (chaos/checks.py);
- never two epochs of a job unfinished at once, and nothing of the job live (see leftovers).
A job that ended before its nodes could do what was planned (a fault failed it, or a cancel)
is only said so.

The largest job: ready, released, with exactly one create per node of its winning attempt; or
failed, with nothing of it left.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

from chaos.nodes import WorkLog
from chaos.report import Check
from gpuprov.models import AttemptOutcome, JobStatus
from providers.fake.state import AgentLease

if TYPE_CHECKING:
    from chaos.plan import JobRun


def judge_runs(
    jobs: list[JobRun],
    logs: dict[str, WorkLog],
    leftovers: dict[str, list[str]],
    seed: int,
    partitions: dict[str, list[AgentLease]] | None = None,
) -> Check | None:
    """`partitions`: job -> its partitioned machines' agent leases (the ledger's)."""
    runs = [job for job in jobs if job.role.work is not None and job.handle is not None]
    if not runs:
        return None
    problems: list[str] = []
    verdicts: Counter[str] = Counter()
    for job in runs:
        log = logs.get(job.name, WorkLog())
        if job.role.work is not None and job.role.work.ending == "partition":
            verdict, trouble = _partitioned(job, log, (partitions or {}).get(job.name, []))
        else:
            verdict, trouble = _verdict(job, log)
        job.notes.append(f"{verdict}; {log.describe()}")
        verdicts[verdict.split(":")[0]] += 1
        trouble += log.overlaps[:3] + [f"left {x}" for x in leftovers.get(job.name, [])]
        problems += [f"seed {seed}: {job.name} ({job.role.describe()}): {t}" for t in trouble]
    return Check(
        "jobs that run: exits, kills, partitions and restarts as planned, never two epochs at once",
        not problems,
        f"{len(runs)} job(s): " + ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items())),
        problems,
    )


def _verdict(job: JobRun, log: WorkLog) -> tuple[str, list[str]]:
    work, final, state = job.role.work, job.final, job.state
    assert work is not None
    if final is None:
        return f"no final status ({state})", [f"its final status could not be read ({state})"]
    error = _first_line(final.error)
    if not log.starts:
        trouble = ["completed without running"] if state == "completed" else []
        return f"never ran: ended {state}", trouble
    if work.ending == "until_stopped":
        trouble = [] if state == "cancelled" else [f"ran until stopped but ended {state}: {error}"]
        return f"stopped by its cancel: ended {state}", trouble
    if work.ending == "kill":
        return _killed(job, log, final)
    if work.code == 0:
        finished = _epochs_all_exited_0(log, job.nodes)
        if not finished:
            return f"ended {state} before its nodes exited", []
        ok = state == "completed"
        return "every node exited 0: completed", [] if ok else [f"ended {state}: {error}"]
    if (work.rank, work.code) not in {(rank, code) for _, rank, code in log.exits}:
        return f"ended {state} before node {work.rank} exited", []
    named = f"node {work.rank} (" in (final.error or "")
    named = named and f"exited with code {work.code}" in (final.error or "")
    if state == "failed" and named:
        return f"node {work.rank} exited {work.code}: failed naming them", []
    return f"node {work.rank} exited {work.code}", [f"ended {state}, error: {error}"]


def _killed(job: JobRun, log: WorkLog, final: JobStatus) -> tuple[str, list[str]]:
    work, state = job.role.work, job.state
    assert work is not None
    if log.kill is None:
        return f"ended {state} before the kill", []
    starts = Counter(rank for _, rank in log.starts)
    ranks = range(job.nodes)
    error = _first_line(final.error)
    if work.max_restarts == 0:
        trouble = []
        if state != "failed" or "no restart left" not in (final.error or ""):
            trouble.append(f"killed without a restart left but ended {state}: {error}")
        if any(starts[rank] != 1 for rank in ranks):
            trouble.append(f"the work started {dict(starts)} times by rank, not once each")
        return "killed, no restart left: failed", trouble
    killed_attempt = _attempt_of(job.name, log.kill[2])
    if state == "completed":
        trouble = []
        if len(final.restarts) != 1:
            trouble.append(f"{len(final.restarts)} restart(s) recorded, not 1")
        if any(starts[rank] != 2 for rank in ranks):
            trouble.append(f"the work started {dict(starts)} times by rank, not twice each")
        last = final.attempts[-1] if final.attempts else None
        lost = next((a for a in final.attempts if a.number == killed_attempt), None)
        if last is None or lost is None or last.offer.id == lost.offer.id:
            trouble.append("the second run was not on another offer")
        return "killed, restarted on another offer: completed", trouble
    if state == "failed" and len(final.restarts) == 1 and all(starts[r] <= 2 for r in ranks):
        return f"killed, restarted, placing it again failed: {error[:80]}", []
    return f"killed with a restart left: ended {state}", [
        f"ended {state} with {len(final.restarts)} restart(s), starts {dict(starts)}: {error}"
    ]


def _partitioned(job: JobRun, log: WorkLog, leases: list[AgentLease]) -> tuple[str, list[str]]:
    work, final, state = job.role.work, job.final, job.state
    assert work is not None
    if final is None:
        return f"no final status ({state})", [f"its final status could not be read ({state})"]
    cut = [lease for lease in leases if lease.cut_at is not None]
    if not cut:
        return f"never cut off: ended {state}", []
    error = _first_line(final.error)
    if final.ready_at is None and not log.starts:
        # Cut off while the job was still provisioning (a busy machine: its other nodes were
        # not ready yet): the node's silence cannot be judged before the job runs, and its
        # provisioning deadline is what ends it; what it left is judged with every job's.
        timed_out = state == "failed" and "provisioning timed out" in (final.error or "")
        trouble = [] if timed_out else [f"cut off before it was placed but ended {state}: {error}"]
        return "partitioned before it was placed: provisioning timed out", trouble
    silent = "went silent" in (final.error or "") or any(
        "went silent" in restart.cause for restart in final.restarts
    )
    held = "" if log.cut else " (cut off before its work started)"
    if work.max_restarts == 0:
        trouble = []
        if state != "failed" or "no restart left" not in (final.error or "") or not silent:
            trouble.append(f"partitioned without a restart left but ended {state}: {error}")
        return f"partitioned, lost, no restart left: failed{held}", trouble
    starts = Counter(rank for _, rank in log.starts)
    second = {rank for epoch, rank in log.starts if epoch == 1}
    if state == "completed":
        trouble = []
        if len(final.restarts) != 1 or not silent:
            causes = [restart.cause for restart in final.restarts]
            trouble.append(f"{len(final.restarts)} restart(s), not 1 for its silence: {causes}")
        if second != set(range(job.nodes)) or any(n > 2 for n in starts.values()):
            trouble.append(f"the work started {sorted(log.starts)}, not once more on every node")
        return f"partitioned, lost, restarted: completed{held}", trouble
    if state == "failed" and len(final.restarts) == 1 and silent:
        return f"partitioned, restarted, placing it again failed: {error[:80]}", []
    return f"partitioned with a restart left: ended {state}", [
        f"ended {state} with {len(final.restarts)} restart(s), starts {dict(starts)}: {error}"
    ]


def _epochs_all_exited_0(log: WorkLog, nodes: int) -> list[int]:
    by_epoch: dict[int, set[int]] = {}
    for epoch, rank, code in log.exits:
        if code == 0:
            by_epoch.setdefault(epoch, set()).add(rank)
    return [epoch for epoch, ranks in by_epoch.items() if len(ranks) == nodes]


def _attempt_of(job: str, vm: str) -> int:
    """`<job>-a2-n0-<tag>` -> 2 (0 when it is not such a name)."""
    found = re.match(rf"^{re.escape(job)}-a(\d+)-n", vm)
    return int(found.group(1)) if found else 0


def _first_line(text: str | None) -> str:
    return (text or "no error").strip().splitlines()[0][:200]


# ---------------------------------------------------------------- the largest job


def judge_largest(
    jobs: list[JobRun], creates: dict[str, int], leftovers: dict[str, list[str]], seed: int
) -> Check | None:
    largest = [job for job in jobs if job.role.kind == "largest"]
    if not largest:
        return None
    problems, verdicts = [], []
    for job in largest:
        verdict, trouble = _largest(job, creates)
        trouble += [f"left {x}" for x in leftovers.get(job.name, [])]
        job.notes.append(verdict)
        verdicts.append(f"{job.name}: {verdict}")
        problems += [f"seed {seed}: {job.name}: {t}" for t in trouble]
    return Check(
        "the largest job: ready and released with one create per node, or failed leaving nothing",
        not problems,
        "; ".join(verdicts),
        problems,
    )


def _largest(job: JobRun, creates: dict[str, int]) -> tuple[str, list[str]]:
    final, state = job.final, job.state
    mine = {vm: n for vm, n in creates.items() if vm.startswith(f"{job.name}-a")}
    made = f"{sum(mine.values())} create(s) over {len(mine)} VM identities"
    if final is None:
        return f"ended {state}, no final status", ["its final status could not be read"]
    if state == "failed":
        return f"failed cleanly ({made}): {_first_line(final.error)}", []
    if state != "completed":
        return f"ended {state} ({made})", [f"ended {state}"]
    won = [a for a in final.attempts if a.outcome is AttemptOutcome.SUCCEEDED]
    if final.ready_at is None or not won:
        return f"completed without being ready ({made})", ["completed without being ready"]
    attempt = won[-1]
    nodes = {vm: n for vm, n in mine.items() if vm.startswith(f"{job.name}-a{attempt.number}-")}
    trouble = []
    if len(nodes) != job.nodes or any(n != 1 for n in nodes.values()):
        trouble.append(f"attempt #{attempt.number} has {len(nodes)} VM identities, not {job.nodes}")
    return (
        f"ready on attempt #{attempt.number} ({attempt.offer.id}){_timing(job, final)}, "
        f"released: {len(nodes)} machines created once each; {made} in all"
    ), trouble


def _timing(job: JobRun, final: JobStatus) -> str:
    """When it was ready after its submission, and how long its release took, where known."""
    if job.submitted_wall is None or final.ready_at is None:
        return ""
    ready = final.ready_at.timestamp() - job.submitted_wall
    text = f" {ready:.0f}s after submission"
    if job.closed_wall is not None:
        text += f", ended {job.closed_wall - final.ready_at.timestamp():.0f}s later"
    return text
