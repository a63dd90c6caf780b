"""Every attempt's outcome, kept per offering: `offer_attempts` (gpuprov/store/offer_stats.py).

One row per attempt of a run (unique per job, run, attempt): the offering it tried, how it
ended (ready, failed with a kind at a step, lost a race, abandoned) and how long its nodes took
to be ready. Kept `[offers] stats_retention_days`, at most `stats_max_per_offering` per offering.

Revision ID: 0013_offer_stats
Revises: 0012_capacity_backoff
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_offer_stats"
down_revision = "0012_capacity_backoff"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "offer_attempts",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("offering", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("run", sa.String(), nullable=False, server_default=""),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=True),
        sa.Column("step", sa.String(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seconds_to_ready", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_offer_attempts"),
        sa.UniqueConstraint("job", "run", "attempt", name="uq_offer_attempts_job_run_attempt"),
    )
    op.create_index(
        "ix_offer_attempts_offering_ended_at", "offer_attempts", ["offering", "ended_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_offer_attempts_offering_ended_at", table_name="offer_attempts")
    op.drop_table("offer_attempts")
