"""Workflow code versions: the one `workflow.patched` gate for the changes made since the
committed histories (tests/histories/) were recorded.

Every change of this release that alters what a running workflow does is behind `current()`:
the cancelled-step-is-cancellation fix, terminating every started create, recording a failed
cleanup as an orphan, waiting for shared blocks to lapse, bookkeeping as local activities, the
SSH bootstrap step, the ready job's health checks and the offers' skipped providers. A history
recorded before them replays with `current()` False, so it takes the old path.

`adopt()` is called first thing in each workflow's run: the patch marker is then the first
command of the first workflow task, before any local activity, and every later `current()` is
the memoised answer. (A marker first recorded mid-run, in a workflow task that also resolved a
local activity, made a query's replay fail with a nondeterminism error: see
tests/workflows/test_coalescing.py, which caught it.)
`lean()` is the second gate (issue 8, fewer server round trips per job): the job's search
attributes start from what the client set at start (queued, gpu) and change in one upsert when
the first offer is tried (provisioning, provider, region); a job first reads what it needs in
one local activity (`job_context`: capabilities, shared blocks, existing workers reserved); a
single-node job's bring-up is one activity (`launch`: prepare, create; several nodes keep
prepare-all-then-create-all) and a node's teardown one (`retire`: delete, confirm gone, mark
terminated, clean up), pushed once before its prepare or launch.
`lean()` implies `current()`, and a lean workflow records only the 2026-12-01 marker.
To change workflow code again: add a new id here, gate the change on it, and keep the old branch
until no open workflow and no committed history needs it (docs/architecture.md, "Changing
workflow code safely").
"""

from __future__ import annotations

from temporalio import workflow

RELEASE_2026_11 = "gpuprov-2026-11-30"
RELEASE_2026_12 = "gpuprov-2026-12-01"


def adopt() -> None:
    """Record (or, replaying, read) the version gate before the workflow does anything else."""
    current()


def lean() -> bool:
    """True for workflows started on this code (issue 8's leaner lifecycle); False when
    replaying a history recorded before it. Asked first: a lean workflow records only this
    marker (each marker also upserts the TemporalChangeVersion search attribute)."""
    return workflow.patched(RELEASE_2026_12)


def current() -> bool:
    """True for workflows started on the 2026-11-30 code or later; False when replaying an
    older history. A lean workflow is current without the 2026-11-30 marker."""
    return lean() or workflow.patched(RELEASE_2026_11)
