"""Every row a job writes belongs to one run of the job: a name submitted again starts clean.

A `run` column (the run's tag; "" where it cannot be told) on vms, work, log_chunks,
cost_records, workers and log_usage; `job_runs`, one row per run of a name. The work of a run
is unique per (job, run, epoch, rank), and a run's output is capped on its own.

Rows already there get the run their VM identity names (`<name>-a<n>-n<i>-<tag>`): VM rows,
actual costs, managed workers, the work of managed nodes and its output. Estimates and the
work of existing workers name no machine and keep "".

Revision ID: 0010_runs
Revises: 0009_vm_fences
Create Date: 2026-12-04
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = "0010_runs"
down_revision = "0009_vm_fences"
branch_labels = None
depends_on = None

RUN_TABLES = ("vms", "work", "log_chunks", "cost_records", "workers")
_TAGGED_VM = re.compile(r"-a\d+-n\d+-(?P<run>[0-9a-f]{6})$")


def _run_column() -> sa.Column:
    return sa.Column("run", sa.String(), nullable=False, server_default="")


def upgrade() -> None:
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(_run_column())
    with op.batch_alter_table("work") as work:
        work.drop_constraint("uq_work_job_epoch_node_rank", type_="unique")
        work.create_unique_constraint(
            "uq_work_job_run_epoch_node_rank", ["job", "run", "epoch", "node_rank"]
        )
    op.drop_index("ix_log_chunks_job", table_name="log_chunks")
    op.create_index("ix_log_chunks_job_run", "log_chunks", ["job", "run", "id"])
    op.create_table(
        "job_runs",
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("run", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job", "run", name="pk_job_runs"),
    )
    _backfill_runs()
    _usage_per_run()


def _backfill_runs() -> None:
    connection = op.get_bind()
    for row_id, vm in connection.execute(sa.text("SELECT id, vm FROM vms")).all():
        match = _TAGGED_VM.search(vm)
        if match:
            connection.execute(
                sa.text("UPDATE vms SET run = :run WHERE id = :id"),
                {"run": match["run"], "id": row_id},
            )
    of_vm = "(SELECT vms.run FROM vms WHERE vms.vm = {table}.vm)"
    for table in ("work", "cost_records", "workers"):
        op.execute(
            f"UPDATE {table} SET run = {of_vm.format(table=table)} WHERE vm IN (SELECT vm FROM vms)"
        )
    op.execute(
        "UPDATE log_chunks SET run = (SELECT work.run FROM work WHERE work.id = log_chunks.work_id)"
        " WHERE work_id IN (SELECT id FROM work)"
    )
    op.execute(
        "INSERT INTO job_runs (job, run, created_at) "
        "SELECT job, run, MIN(created_at) FROM vms WHERE run <> '' GROUP BY job, run"
    )


def _usage_per_run() -> None:
    """Each run's kept bytes counted again; a job's dropped bytes go to the run whose note
    says so (the run the cap last dropped for)."""
    connection = op.get_bind()
    dropped = dict(connection.execute(sa.text("SELECT job, dropped_bytes FROM log_usage")).all())
    noted = dict(
        connection.execute(
            sa.text("SELECT job, MAX(run) FROM log_chunks WHERE stream = 'gpuprov' GROUP BY job")
        ).all()
    )
    op.drop_table("log_usage")
    _create_usage(["job", "run"], with_run=True)
    op.execute(
        "INSERT INTO log_usage (job, run, kept_bytes, dropped_bytes, updated_at) "
        "SELECT job, run, SUM(size), 0, CURRENT_TIMESTAMP FROM log_chunks GROUP BY job, run"
    )
    for job, count in dropped.items():
        if count and job in noted:
            connection.execute(
                sa.text(
                    "UPDATE log_usage SET dropped_bytes = :count WHERE job = :job AND run = :run"
                ),
                {"count": count, "job": job, "run": noted[job]},
            )


def _create_usage(key: list[str], *, with_run: bool) -> None:
    columns = [sa.Column("job", sa.String(), nullable=False)]
    if with_run:
        columns.append(_run_column())
    op.create_table(
        "log_usage",
        *columns,
        sa.Column("kept_bytes", sa.BigInteger(), nullable=False),
        sa.Column("dropped_bytes", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(*key, name="pk_log_usage"),
    )


def downgrade() -> None:
    """Back to one set of rows per name: this fails where a name has two runs' work for one
    (epoch, rank), which 0009's schema cannot hold."""
    connection = op.get_bind()
    usage = connection.execute(
        sa.text(
            "SELECT job, SUM(kept_bytes), SUM(dropped_bytes), MAX(updated_at) "
            "FROM log_usage GROUP BY job"
        )
    ).all()
    op.drop_table("log_usage")
    _create_usage(["job"], with_run=False)
    for job, kept, dropped, updated_at in usage:
        connection.execute(
            sa.text(
                "INSERT INTO log_usage (job, kept_bytes, dropped_bytes, updated_at) "
                "VALUES (:job, :kept, :dropped, :updated_at)"
            ),
            {"job": job, "kept": kept, "dropped": dropped, "updated_at": updated_at},
        )
    op.drop_table("job_runs")
    op.drop_index("ix_log_chunks_job_run", table_name="log_chunks")
    op.create_index("ix_log_chunks_job", "log_chunks", ["job", "id"])
    with op.batch_alter_table("work") as work:
        work.drop_constraint("uq_work_job_run_epoch_node_rank", type_="unique")
        work.create_unique_constraint("uq_work_job_epoch_node_rank", ["job", "epoch", "node_rank"])
    for table in reversed(RUN_TABLES):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("run")
