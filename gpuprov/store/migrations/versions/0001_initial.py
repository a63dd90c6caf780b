"""Initial schema: vms, join_tokens, cost_records, blocks, workers, orphans.

Revision ID: 0001_initial
Revises:
Create Date: 2026-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def _time(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "vms",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("node_index", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("vm", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=True),
        sa.Column("instance_ids", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        _time("created_at"),
        _time("terminated_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_vms"),
        sa.UniqueConstraint("vm", name="uq_vms_vm"),
    )
    op.create_index("ix_vms_job", "vms", ["job"])

    op.create_table(
        "join_tokens",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("token_sha256", sa.String(), nullable=False),
        sa.Column("vm", sa.String(), nullable=True),
        sa.Column("label", sa.String(), nullable=True),
        _time("expires_at"),
        _time("used_at", nullable=True),
        _time("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_join_tokens"),
        sa.UniqueConstraint("token_sha256", name="uq_join_tokens_token_sha256"),
        sa.ForeignKeyConstraint(["vm"], ["vms.vm"], name="fk_join_tokens_vm_vms"),
        sa.CheckConstraint("(vm IS NULL) <> (label IS NULL)", name="ck_join_tokens_one_binding"),
    )
    op.create_index("ix_join_tokens_vm", "join_tokens", ["vm"])
    op.create_index("ix_join_tokens_label", "join_tokens", ["label"])

    op.create_table(
        "cost_records",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("amount", sa.Float(), nullable=False),
        sa.Column("currency", sa.String(), nullable=False),
        sa.Column("unit", sa.String(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        _time("recorded_at"),
        sa.PrimaryKeyConstraint("id", name="pk_cost_records"),
    )
    op.create_index("ix_cost_records_job", "cost_records", ["job"])

    op.create_table(
        "blocks",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("scope", sa.String(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("job", sa.String(), nullable=False),
        _time("created_at"),
        _time("expires_at"),
        sa.PrimaryKeyConstraint("id", name="pk_blocks"),
        sa.UniqueConstraint("scope", "key", name="uq_blocks_scope_key"),
    )
    op.create_index("ix_blocks_expires_at", "blocks", ["expires_at"])

    op.create_table(
        "workers",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("origin", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=True),
        sa.Column("region", sa.String(), nullable=True),
        sa.Column("label", sa.String(), nullable=True),
        sa.Column("vm", sa.String(), nullable=True),
        sa.Column("capabilities", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("job", sa.String(), nullable=True),
        _time("registered_at"),
        _time("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_workers"),
    )
    op.create_index("ix_workers_job", "workers", ["job"])
    op.create_index("ix_workers_state", "workers", ["state"])

    op.create_table(
        "orphans",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=True),
        sa.Column("vm", sa.String(), nullable=False),
        sa.Column("instance_ids", sa.JSON(), nullable=False),
        _time("first_seen"),
        _time("last_seen"),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        _time("resolved_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_orphans"),
    )
    op.create_index("ix_orphans_vm", "orphans", ["vm"])
    # At most one unresolved row per VM.
    op.create_index(
        "uq_orphans_open_vm",
        "orphans",
        ["vm"],
        unique=True,
        sqlite_where=sa.text("resolved_at IS NULL"),
        postgresql_where=sa.text("resolved_at IS NULL"),
    )


def downgrade() -> None:
    for table in ("orphans", "workers", "blocks", "cost_records", "join_tokens", "vms"):
        op.drop_table(table)
