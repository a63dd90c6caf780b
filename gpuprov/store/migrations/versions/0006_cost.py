"""Actual cost: a VM row keeps its offer's quote, the cloud's billing terms and its launch time;
a cost record may name its provider and machine, and a machine has at most one actual.

Revision ID: 0006_cost
Revises: 0005_work
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_cost"
down_revision = "0005_work"
branch_labels = None
depends_on = None

_VM_COLUMNS = (
    ("instance_type", sa.String()),
    ("price_amount", sa.Float()),
    ("price_currency", sa.String()),
    ("price_unit", sa.String()),
    ("price_source", sa.Text()),
    ("billing_granularity_seconds", sa.Float()),
    ("billing_minimum_seconds", sa.Float()),
    ("launched_at", sa.DateTime(timezone=True)),
)
_COST_COLUMNS = (
    ("provider", sa.String()),
    ("vm", sa.String()),
    ("billed_seconds", sa.Float()),
)
_ACTUAL = sa.text("kind = 'actual'")


def upgrade() -> None:
    # Every column is nullable: rows written before keep NULL (no quote, launch unknown).
    for name, column_type in _VM_COLUMNS:
        op.add_column("vms", sa.Column(name, column_type, nullable=True))
    for name, column_type in _COST_COLUMNS:
        op.add_column("cost_records", sa.Column(name, column_type, nullable=True))
    op.create_index(
        "uq_cost_records_actual_vm",
        "cost_records",
        ["vm"],
        unique=True,
        sqlite_where=_ACTUAL,
        postgresql_where=_ACTUAL,
    )


def downgrade() -> None:
    op.drop_index("uq_cost_records_actual_vm", table_name="cost_records")
    # ALTER TABLE ... DROP COLUMN on both (SQLite has it since 3.35): no table is rebuilt, so
    # the join tokens' foreign key to vms is never in the way.
    for name, _ in reversed(_COST_COLUMNS):
        op.drop_column("cost_records", name)
    for name, _ in reversed(_VM_COLUMNS):
        op.drop_column("vms", name)
