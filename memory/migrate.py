"""Schema migrations, run programmatically when a store is opened.

What: `upgrade(connection)` brings a database to the newest revision in `memory/migrations/versions`,
`check(connection)` only reports where it stands. No alembic.ini is needed: the script location is
this package's folder and the connection is passed in.

Why checks first: a database written by a newer agent-runtime carries a revision this code does
not know. Running the migrations anyway would crash half way or, worse, write; instead we stop with
`DatabaseTooNewError` and say which version to upgrade to. A database that has tables but no
Alembic revision is somebody else's database, and we refuse to touch it.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

from memory.errors import DatabaseOutdatedError, DatabaseTooNewError, NotADatabaseError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest schema revision this code knows."""
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, f"no migrations found in {MIGRATIONS_DIR}"
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at, or None for a database without our schema."""
    return MigrationContext.configure(connection).get_current_revision()


def check(connection: Connection, where: str) -> str | None:
    """Raise if the database is foreign or newer than the code; return its current revision.

    `where` names the database in messages (a path or a URL without password).
    """
    revision = current_revision(connection)
    script = ScriptDirectory.from_config(_config())
    if revision is None:
        tables = set(inspect(connection).get_table_names())
        if tables - {"alembic_version"}:
            raise NotADatabaseError(
                f"{where} is a database but not an agent-runtime memory (tables: "
                f"{', '.join(sorted(tables)[:8])}); point the store at an empty or memory database"
            )
        return None
    try:
        script.get_revision(revision)
    except Exception as exc:  # alembic raises several types for an unknown revision
        raise DatabaseTooNewError(
            f"{where} is at schema revision {revision!r}, which this agent-runtime does not know "
            f"(newest known: {head_revision()!r}); it was written by a newer version: upgrade "
            "agent-runtime to open it"
        ) from exc
    return revision


def upgrade(connection: Connection, where: str) -> None:
    """Migrate the database to the head revision (in the caller's transaction)."""
    if check(connection, where) != head_revision():
        command.upgrade(_config(connection), "head")


def require_head(connection: Connection, where: str) -> None:
    """For read-only opens: the database must already be at the head revision."""
    revision = check(connection, where)
    if revision != head_revision():
        raise DatabaseOutdatedError(
            f"{where} is at schema revision {revision!r}, not {head_revision()!r}; open it once "
            "for writing (any agent-runtime memory command without read-only) to migrate it"
        )
