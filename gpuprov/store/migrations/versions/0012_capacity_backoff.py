"""Capacity that comes and goes: a stockout's block backs off per offering, and an offering
that keeps failing is probed by a few creates per window (gpuprov/store/capacity.py).

- blocks.strikes: the Capacity failures in a row of this key (a failure while its block is
  still active does not count again; a success or a long quiet resets it): its block lasts
  `[jobs] capacity_backoff_seconds` doubled per strike, at most `capacity_backoff_max_seconds`;
- blocks.probes, blocks.probe_window_start: the creates granted since the window started, once
  the block has lapsed (the launch budget: `[jobs] launch_probes` per
  `launch_probe_window_seconds`).

Revision ID: 0012_capacity_backoff
Revises: 0011_leases
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_capacity_backoff"
down_revision = "0011_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("blocks") as blocks:
        blocks.add_column(sa.Column("strikes", sa.Integer(), nullable=False, server_default="0"))
        blocks.add_column(sa.Column("probes", sa.Integer(), nullable=False, server_default="0"))
        blocks.add_column(
            sa.Column("probe_window_start", sa.DateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("blocks") as blocks:
        blocks.drop_column("probe_window_start")
        blocks.drop_column("probes")
        blocks.drop_column("strikes")
