"""An index for the long polls' watcher (gpuprov/api/work_waits.py): the assignments not yet
started, by when they were written, read every fraction of a second while nodes wait.

Revision ID: 0015_work_waits
Revises: 0014_teams
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0015_work_waits"
down_revision = "0014_teams"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_work_state_created_at", "work", ["state", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_work_state_created_at", table_name="work")
