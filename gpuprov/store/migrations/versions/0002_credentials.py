"""Credentials: operator API keys and per-worker credentials (SHA-256 of the secret only).

Revision ID: 0002_credentials
Revises: 0001_initial
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_credentials"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def _time(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "worker_credentials",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("worker_id", sa.String(), nullable=False),
        sa.Column("secret_sha256", sa.String(), nullable=False),
        _time("created_at"),
        _time("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_worker_credentials"),
        sa.ForeignKeyConstraint(
            ["worker_id"], ["workers.id"], name="fk_worker_credentials_worker_id_workers"
        ),
    )
    op.create_index("ix_worker_credentials_worker_id", "worker_credentials", ["worker_id"])

    op.create_table(
        "operator_keys",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("secret_sha256", sa.String(), nullable=False),
        _time("created_at"),
        _time("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_operator_keys"),
    )


def downgrade() -> None:
    op.drop_table("operator_keys")
    op.drop_table("worker_credentials")
