"""Teams, roles and the secrets vault (gpuprov/store/teams.py, gpuprov/store/secrets.py).

`teams`: a team's name and its budget (a spend limit per calendar month in USD, a limit on GPUs
held at once, what happens to a running job that crosses the spend limit). The team `default`
exists from the start: jobs that name none are its. `operator_keys` gain the team a key belongs
to (NULL: an admin key over every team) and its role; keys minted before roles are admins, as
they could do everything. `job_runs` gain the team of the run (NULL: a run from before teams,
read as `default`) and the GPUs each of its machines holds (what a team's limit on GPUs held
at once counts). `secrets`: a value encrypted with AES-256-GCM, per team (`""`: global, seen
by every team), unique per team and name.

Revision ID: 0014_teams
Revises: 0013_offer_stats
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_teams"
down_revision = "0013_offer_stats"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("monthly_budget_usd", sa.Float(), nullable=True),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("on_exceed", sa.String(), nullable=False, server_default="release"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_teams"),
    )
    op.execute(
        "INSERT INTO teams (name, on_exceed, created_at) "
        "VALUES ('default', 'release', CURRENT_TIMESTAMP)"
    )
    with op.batch_alter_table("operator_keys") as batch:
        batch.add_column(sa.Column("team", sa.String(), nullable=True))
        batch.add_column(sa.Column("role", sa.String(), nullable=False, server_default="admin"))
    with op.batch_alter_table("job_runs") as batch:
        batch.add_column(sa.Column("team", sa.String(), nullable=True))
        batch.add_column(sa.Column("gpus_per_node", sa.Integer(), nullable=True))
    op.create_table(
        "secrets",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("team", sa.String(), nullable=False, server_default=""),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("key_id", sa.String(), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_secrets"),
        sa.UniqueConstraint("team", "name", name="uq_secrets_team_name"),
    )


def downgrade() -> None:
    op.drop_table("secrets")
    with op.batch_alter_table("job_runs") as batch:
        batch.drop_column("gpus_per_node")
        batch.drop_column("team")
    with op.batch_alter_table("operator_keys") as batch:
        batch.drop_column("role")
        batch.drop_column("team")
    op.drop_table("teams")
