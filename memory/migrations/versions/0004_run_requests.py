"""Run requests and forgotten lessons: what an operator asks of a running loop, and lessons forgotten.

- `run_requests`: one row per request to a run that its loop carries out at its next phase boundary (today:
  `reconsolidate`, left by `agent-runtime lessons forget` when it rolled the run's adapter back), with its
  payload, when it was made, when it was done and what came of it.
- `lessons.forgotten_at`: set when a lesson was forgotten (`lessons forget`); its status is then `retired`.

Both are additions (a new table, a nullable column), so existing databases convert in place without a
table rebuild.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "run_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", JSON, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_requests_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_requests")),
    )
    op.create_index("ix_run_requests_run_id_done_at", "run_requests", ["run_id", "done_at"], unique=False)
    op.add_column("lessons", sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("lessons", "forgotten_at")  # in place (SQLite >= 3.35): a rebuild would cascade to members
    op.drop_index("ix_run_requests_run_id_done_at", table_name="run_requests")
    op.drop_table("run_requests")
