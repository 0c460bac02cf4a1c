"""Lesson scope: the environments whose prompts a lesson may enter.

- `lessons.scope`: a JSON list of environment ids, `family:NAME` entries or `*` (`distill.lessons.scope`). Every
  lesson stored before this revision was shown in every environment's prompt, so it migrates to `["*"]`: what it
  did before, it does after. New lessons are scoped to the environment their evidence came from.

A column, not metadata: the prompt's lessons are chosen by it on every episode, and an import checks it as a
field of its own. Non-null with a server default: existing databases convert in place, no rebuild.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "lessons",
        sa.Column(
            "scope",
            sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
            nullable=False,
            server_default=sa.text("'[\"*\"]'"),
        ),
    )


def downgrade() -> None:
    op.drop_column("lessons", "scope")
