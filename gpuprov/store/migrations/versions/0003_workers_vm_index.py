"""workers.vm indexed: a job waiting for its nodes reads their workers by VM identity.

Revision ID: 0003_workers_vm_index
Revises: 0002_credentials
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0003_workers_vm_index"
down_revision = "0002_credentials"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_workers_vm", "workers", ["vm"])


def downgrade() -> None:
    op.drop_index("ix_workers_vm", table_name="workers")
