"""The runs of a job name: which run a row belongs to, and which run a reader means.

A job name can be submitted again once its job has ended. Each submission is a run of the
name, tagged by `vm_run_tag` (workflows/attempt.py): six hex digits of the workflow's first run
id, the same across continue-as-new and resets, and the end of every VM identity the run makes
(`<name>-a<attempt>-n<index>-<tag>`). Every row a job writes (VM rows, work, output, costs, the
reservation of a worker) carries its run, and a run reads only its own rows; so a name used
again starts clean, and the earlier runs' rows stay as they were, readable by their tag.

    run_of_vm(vm)             the run tag at the end of a VM identity ("" if it has none)
    note_run(session, ...)    the run recorded in `job_runs`, once (each writer of a run)
    latest_run(db, job)       the name's newest run: what readers show by default
    runs_of(db, job)          every run of the name, oldest first
    pick_run(db, job, run)    the run a reader asked for, or the latest; RunNotFound if unknown
"""

from __future__ import annotations

import re
from datetime import datetime

from sqlmodel import Session, col, select

from gpuprov.store.db import NO_RUN, Database, JobRun, dialect_insert, utcnow
from providers.base import Model

# A run tag as vm_run_tag makes it, at the end of a VM identity.
_TAGGED_VM = re.compile(r"-a\d+-n\d+-(?P<run>[0-9a-f]{6})$")
RUN_PATTERN = r"^[0-9a-f]{6}$"  # what a reader may ask for (`--run`, `run=`)
NO_SUCH_RUN: dict[int | str, dict[str, str]] = {404: {"description": "the job has no such run"}}


class RunNotFound(Exception):
    """A reader asked for a run the name never had."""


class JobRunView(Model):
    run: str
    started: datetime  # when the run first wrote a row


def run_of_vm(vm: str) -> str:
    """The run a VM identity was made by; NO_RUN for an identity without a run tag."""
    match = _TAGGED_VM.search(vm)
    return match["run"] if match else NO_RUN


def note_run(session: Session, dialect: str, job: str, run: str | None) -> None:
    """Record the run of `job` inside the caller's transaction (nothing if already known)."""
    if not run:
        return
    insert = dialect_insert(dialect)
    statement = insert(JobRun).values(job=job, run=run, created_at=utcnow())
    session.execute(statement.on_conflict_do_nothing(index_elements=["job", "run"]))


def runs_of(db: Database, job: str) -> list[JobRunView]:
    with db.session() as session:
        rows = session.exec(
            select(JobRun)
            .where(JobRun.job == job)
            .order_by(col(JobRun.created_at), col(JobRun.run))
        ).all()
    return [JobRunView(run=row.run, started=row.created_at) for row in rows]


def latest_run(db: Database, job: str) -> str:
    """The name's newest run; NO_RUN when it has none recorded (rows from before runs were)."""
    runs = runs_of(db, job)
    return runs[-1].run if runs else NO_RUN


def pick_run(db: Database, job: str, run: str | None) -> str:
    """`run` if the name had it, else RunNotFound; the latest run when `run` is None."""
    if run is None:
        return latest_run(db, job)
    if run not in {known.run for known in runs_of(db, job)}:
        raise RunNotFound(f"job {job!r} has no run {run!r}")
    return run
