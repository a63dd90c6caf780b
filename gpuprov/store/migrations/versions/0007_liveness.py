"""Liveness on the workers table: last heartbeat, heartbeat count, health, draining, and the
changed/notified pair that tells the sweep which jobs to wake.

Rows registered before this revision are taken as last seen at their last update, so a worker
whose agent never heartbeats is found lost one `[workers] lost_after_seconds` after the upgrade.

Revision ID: 0007_liveness
Revises: 0006_cost
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_liveness"
down_revision = "0006_cost"
branch_labels = None
depends_on = None

COLUMNS = (
    "last_seen_at",
    "heartbeats",
    "liveness",
    "health",
    "health_detail",
    "draining",
    "changed_at",
    "notified_at",
)


def _time(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=True)


def upgrade() -> None:
    with op.batch_alter_table("workers") as workers:
        workers.add_column(_time("last_seen_at"))
        workers.add_column(
            sa.Column("heartbeats", sa.Integer(), nullable=False, server_default="0")
        )
        workers.add_column(
            sa.Column("liveness", sa.String(), nullable=False, server_default="alive")
        )
        workers.add_column(
            sa.Column("health", sa.String(), nullable=False, server_default="healthy")
        )
        workers.add_column(sa.Column("health_detail", sa.Text(), nullable=True))
        workers.add_column(
            sa.Column("draining", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        workers.add_column(_time("changed_at"))
        workers.add_column(_time("notified_at"))
    op.execute("UPDATE workers SET last_seen_at = updated_at")


def downgrade() -> None:
    with op.batch_alter_table("workers") as workers:
        for column in reversed(COLUMNS):
            workers.drop_column(column)
