"""The work a job runs on its nodes, and the output it prints.

Revision ID: 0005_work
Revises: 0004_host_keys
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_work"
down_revision = "0004_host_keys"
branch_labels = None
depends_on = None


def _time(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "work",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(), nullable=False),
        sa.Column("vm", sa.String(), nullable=True),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("tail", sa.Text(), nullable=True),
        _time("created_at"),
        _time("started_at", nullable=True),
        _time("ended_at", nullable=True),
        _time("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_work"),
        sa.UniqueConstraint("job", "epoch", "node_rank", name="uq_work_job_epoch_node_rank"),
    )
    op.create_index("ix_work_worker_id", "work", ["worker_id"])
    op.create_table(
        "log_chunks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("work_id", sa.String(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("stream", sa.String(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        _time("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_log_chunks"),
        sa.UniqueConstraint("work_id", "seq", name="uq_log_chunks_work_id_seq"),
    )
    op.create_index("ix_log_chunks_job", "log_chunks", ["job", "id"])


def downgrade() -> None:
    op.drop_table("log_chunks")
    op.drop_table("work")
