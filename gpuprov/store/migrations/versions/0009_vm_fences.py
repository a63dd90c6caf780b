"""The fence of each VM identity: a cloud call that may still land, and a teardown that began.

A retried or cancelled prepare or create can still reach the cloud after the job has started
tearing the node down; the row lets the teardown wait for such a call and lets every later
call refuse (gpuprov/store/fences.py).

Revision ID: 0009_vm_fences
Revises: 0008_log_usage
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_vm_fences"
down_revision = "0008_log_usage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "vm_fences",
        sa.Column("vm", sa.String(), nullable=False),
        sa.Column("fenced_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("call_owner", sa.String(), nullable=True),
        sa.Column("call_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("vm", name="pk_vm_fences"),
    )


def downgrade() -> None:
    op.drop_table("vm_fences")
