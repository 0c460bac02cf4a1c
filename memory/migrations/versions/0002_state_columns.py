"""State in columns: a lesson set's `status` and `made_by`, an evaluation's `kind`.

Until this revision a lesson set's state was the prefix of its free-text note ("candidate: ..." or
"live: ...", a version without a prefix counting as live, and "user:" right after the prefix marking a
version a person made), and gate decisions and lesson utilities were evaluation rows told apart by
their `split` ("gate", "lesson-utility"). Upgrading derives the new columns from those strings with the
same rules the code used to read them, and takes the markers out of the notes, so that an old database
reads back exactly as one written by the new code would. The rules are copied here on purpose: a
migration must keep meaning what it meant when it was written, whatever the code says later.

The columns are added in place (`ALTER TABLE ... ADD COLUMN` with a server default and a named CHECK),
never by recreating a table: on SQLite, with foreign keys on, dropping `lesson_sets` to rebuild it
would cascade into `lesson_set_members` and delete every membership.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 00:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PREFIXES = (("candidate:", "candidate"), ("live:", "live"))
USER_MARK = "user:"

LESSON_SETS = sa.table(
    "lesson_sets",
    sa.column("id", sa.Integer),
    sa.column("note", sa.Text),
    sa.column("status", sa.String),
    sa.column("made_by", sa.String),
)
EVALUATIONS = sa.table("evaluations", sa.column("split", sa.String), sa.column("kind", sa.String))


def read_note(note: str) -> tuple[str, str, str]:
    """(status, made_by, the note without its markers), read as revision 0001's code read a note."""
    for prefix, status in PREFIXES:
        if note.startswith(prefix):
            rest = note[len(prefix) :].lstrip()
            if rest.startswith(USER_MARK):
                # the curator joined its label with "; " ("user:; pool 0: add 1"), the CLI with " "
                return status, "user", rest[len(USER_MARK) :].lstrip().removeprefix(";").lstrip()
            return status, "agent", rest
    return "live", "agent", note


def write_note(status: str, made_by: str, note: str) -> str:
    """The revision 0001 note that reads back as (status, made_by, note)."""
    parts = [f"{status}:"] + ([USER_MARK] if made_by == "user" else []) + ([note] if note else [])
    return " ".join(parts)


def _state_column(name: str, default: str, allowed: tuple[str, ...], table: str) -> sa.Column:
    values = ", ".join(f"'{v}'" for v in allowed)
    return sa.Column(
        name,
        sa.String(length=20),
        sa.CheckConstraint(f"{name} IN ({values})", name=op.f(f"ck_{table}_{name}")),
        nullable=False,
        server_default=default,
    )


def upgrade() -> None:
    op.add_column("lesson_sets", _state_column("status", "live", ("live", "candidate"), "lesson_sets"))
    op.add_column("lesson_sets", _state_column("made_by", "agent", ("agent", "user"), "lesson_sets"))
    op.add_column("evaluations", _state_column("kind", "eval", ("eval", "gate", "lesson-utility"), "evaluations"))
    bind = op.get_bind()
    rows = bind.execute(sa.select(LESSON_SETS.c.id, LESSON_SETS.c.note)).all()
    changes = []
    for row_id, note in rows:
        status, made_by, text = read_note(note)
        changes.append({"row_id": row_id, "new_status": status, "new_made_by": made_by, "new_note": text})
    if changes:
        bind.execute(
            LESSON_SETS.update()
            .where(LESSON_SETS.c.id == sa.bindparam("row_id"))
            .values(
                status=sa.bindparam("new_status"),
                made_by=sa.bindparam("new_made_by"),
                note=sa.bindparam("new_note"),
            ),
            changes,
        )
    for kind in ("gate", "lesson-utility"):
        bind.execute(EVALUATIONS.update().where(EVALUATIONS.c.split == kind).values(kind=kind))


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(LESSON_SETS.c.id, LESSON_SETS.c.status, LESSON_SETS.c.made_by, LESSON_SETS.c.note)
    ).all()
    for row_id, status, made_by, note in rows:
        bind.execute(
            LESSON_SETS.update().where(LESSON_SETS.c.id == row_id).values(note=write_note(status, made_by, note))
        )
    # In place too (SQLite >= 3.35 drops a column whose only CHECK is its own without a rebuild).
    op.drop_column("evaluations", "kind")
    op.drop_column("lesson_sets", "made_by")
    op.drop_column("lesson_sets", "status")
