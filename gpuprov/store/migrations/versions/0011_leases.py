"""Leases and the cloud's notices: how long a node cut off from the API may still run its work,
what the cloud told the node about its machine, and a work stopped because its lease lapsed.

- workers.work_ends_by: each heartbeat sets it to its arrival plus `[workers] lease_seconds`
  plus the stop grace period: past it, a node that heard nothing more has stopped its work
  (a revoked worker's heartbeats write nothing, so its last value is final);
- workers.notice: the cloud's reclaim or maintenance notice the node reported last (JSON), or
  NULL (its JSON, keys sorted, so that a repeat compares equal);
- work.lease_lapsed: the node stopped this work because its lease lapsed.

Revision ID: 0011_leases
Revises: 0010_runs
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_leases"
down_revision = "0010_runs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as workers:
        workers.add_column(sa.Column("work_ends_by", sa.DateTime(timezone=True), nullable=True))
        workers.add_column(sa.Column("notice", sa.Text(), nullable=True))
    with op.batch_alter_table("work") as work:
        work.add_column(
            sa.Column("lease_lapsed", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("work") as work:
        work.drop_column("lease_lapsed")
    with op.batch_alter_table("workers") as workers:
        workers.drop_column("notice")
        workers.drop_column("work_ends_by")
