"""SSH keys in the database: host keys pinned per VM, the deployment's client keys (public).

Revision ID: 0004_host_keys
Revises: 0003_workers_vm_index
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_host_keys"
down_revision = "0003_workers_vm_index"
branch_labels = None
depends_on = None


def _time(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "ssh_host_keys",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("vm", sa.String(), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        _time("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_ssh_host_keys"),
        sa.UniqueConstraint("vm", name="uq_ssh_host_keys_vm"),
    )
    op.create_table(
        "ssh_client_keys",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("fingerprint", sa.String(), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        _time("registered_at"),
        sa.PrimaryKeyConstraint("id", name="pk_ssh_client_keys"),
        sa.UniqueConstraint("fingerprint", name="uq_ssh_client_keys_fingerprint"),
    )


def downgrade() -> None:
    op.drop_table("ssh_client_keys")
    op.drop_table("ssh_host_keys")
