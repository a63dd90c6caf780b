"""What a job says about itself: the Temporal UI's current details and its failure messages.

Pure functions of the job's status (deterministic; no I/O).
"""

from __future__ import annotations

from gpuprov.models import JobStatus
from providers.base import Offer, Severity, Verdict
from workflows.selection import blocking


def current_details(status: JobStatus) -> str:
    """The state, what it waits for, every attempt and block, and every unhealthy node."""
    lines = [f"**{status.state.value}**"]
    if status.waiting_for:
        lines.append(f"waiting for: {status.waiting_for}")
    if status.error:
        lines.append(f"error: {status.error}")
    lines += [f"- attempt {a.describe()}" for a in status.attempts]
    lines += [f"- restart {r.number}: {r.cause}" for r in status.restarts]
    lines += [
        f"- worker {w.vm or w.worker_id}: **lost** (last seen {w.last_seen_at or 'never'})"
        if w.liveness == "lost"
        else f"- worker {w.vm or w.worker_id}: **unhealthy**: {w.detail or 'no detail'}"
        for w in status.workers
        if w.state != "revoked" and (w.liveness == "lost" or w.health == "unhealthy")
    ]
    lines += [
        f"- node {w.rank}: {w.state.value}"
        + (f", exit code {w.exit_code}" if w.exit_code is not None else "")
        for w in status.work
    ]
    lines += [f"- blocked {b.scope.value} {b.key}: {b.kind.value}" for b in status.blocks]
    lines += [
        f"- node {health.vm}: **{health.verdict.value}**: "
        + "; ".join(f.message for f in health.findings if f.severity is not Severity.INFO)
        for health in status.health
        if health.verdict is not Verdict.HEALTHY
    ]
    return "\n".join(lines)


def attempt_lines(status: JobStatus) -> str:
    return "".join(f"\n  {attempt.describe()}" for attempt in status.attempts)


def spent_message(status: JobStatus, offers: list[Offer]) -> str:
    """Why a job that has no offer left to try failed."""
    if not offers:
        reasons = "".join(f"\n  {r}" for r in status.rejected_offers[:20])
        blocks = "".join(f"\n  {b.key}: {b.kind.value}: {b.message}" for b in status.blocks)
        return f"no compatible offer for the job{blocks}{reasons}"
    tried = {attempt.offer.id for attempt in status.attempts}
    skipped = [
        f"\n  {offer.id}: skipped, {block.scope.value} blocked by {block.kind.value}"
        for offer in offers
        if (block := blocking(status.blocks, offer)) is not None and offer.id not in tried
    ]
    count = len(status.attempts)
    return f"every offer failed ({count} tried):{attempt_lines(status)}{''.join(skipped)}"
