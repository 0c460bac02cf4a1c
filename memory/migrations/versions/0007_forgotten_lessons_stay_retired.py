"""A forgotten lesson stays retired: the database refuses a lesson row with `forgotten_at` set and another status.

`agent-runtime lessons forget` retires a lesson and sets `forgotten_at`; nothing may make it active (or proposed, or
consolidated) again, since a live version holding it puts the forgotten text back in every prompt. The store's write
paths refuse that (`memory.lesson_store.refuse_forgotten`); this makes it a rule of the database too, for every
writer: a CHECK constraint on PostgreSQL, and on SQLite two triggers that abort the same inserts and updates (adding
a CHECK to an SQLite table rebuilds it, and with foreign keys on, dropping the old table would cascade into
`lesson_sources`).

A store written before the rule may hold rows that break it (a rollback that made a forgotten lesson live again): they
are repaired first, retired, and keep their `forgotten_at`. A live version that still lists such a lesson is read
without it (`distill.lessons.versions.live_lessons`).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "ck_lessons_forgotten_retired"
RULE = "forgotten_at IS NULL OR status = 'retired'"
BROKEN = "NEW.forgotten_at IS NOT NULL AND NEW.status <> 'retired'"


def upgrade() -> None:
    bind = op.get_bind()
    bind.execute(
        sa.text("UPDATE lessons SET status = 'retired' WHERE forgotten_at IS NOT NULL AND status <> 'retired'")
    )
    if bind.dialect.name == "postgresql":
        op.create_check_constraint(op.f(NAME), "lessons", RULE)
        return
    for event in ("INSERT", "UPDATE OF status, forgotten_at"):
        suffix = event.split()[0].lower()
        op.execute(
            f"CREATE TRIGGER {NAME}_{suffix} BEFORE {event} ON lessons FOR EACH ROW WHEN {BROKEN} "
            f"BEGIN SELECT RAISE(ABORT, 'CHECK constraint failed: {NAME}'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(op.f(NAME), "lessons", type_="check")
        return
    for suffix in ("insert", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS {NAME}_{suffix}")
