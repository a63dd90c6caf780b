"""A running count of each job's log bytes: what is kept in log_chunks and what the cap dropped.

The cap is checked on every chunk a node sends; a count kept beside the chunks makes that one
row's update instead of a sum over every chunk the job has. Chunks already stored are counted
by the upgrade.

Revision ID: 0008_log_usage
Revises: 0007_liveness
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_log_usage"
down_revision = "0007_liveness"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "log_usage",
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("kept_bytes", sa.BigInteger(), nullable=False),
        sa.Column("dropped_bytes", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job", name="pk_log_usage"),
    )
    op.execute(
        "INSERT INTO log_usage (job, kept_bytes, dropped_bytes, updated_at) "
        "SELECT job, SUM(size), 0, CURRENT_TIMESTAMP FROM log_chunks GROUP BY job"
    )


def downgrade() -> None:
    op.drop_table("log_usage")
