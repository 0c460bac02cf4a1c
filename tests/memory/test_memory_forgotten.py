"""A forgotten lesson stays retired: the database refuses a row that is forgotten and not retired (SQLite and
PostgreSQL), and migration 0007 repairs a store that already holds one instead of failing on it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import MetaData, create_engine, update

from distill.lessons import live_lessons
from memory import ExperienceStore, InvalidRecordError
from memory.migrate import MIGRATIONS_DIR, current_revision
from memory.models import Lesson

WHEN = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def _sql_url(memory_url: str) -> str:
    return memory_url if "://" in memory_url else f"sqlite:///{memory_url}/memory.db"


def test_the_database_refuses_a_forgotten_lesson_that_is_not_retired(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    lesson = store.add_lesson("Take the coin.", run_id=run_id, status="active")
    store.forget_lessons([lesson], reason="wrong")
    for status in ("active", "proposed", "consolidated"):
        with pytest.raises(InvalidRecordError, match="forgotten_retired"), store._write() as session:
            session.execute(update(Lesson).where(Lesson.id == lesson).values(status=status))
    with pytest.raises(InvalidRecordError, match="forgotten_retired"), store._write() as session:
        session.add(Lesson(run_id=run_id, text="x", status="active", forgotten_at=WHEN))
    assert store.get_lesson(lesson).status == "retired"
    kept = store.add_lesson("Read the goal.", run_id=run_id, status="active")
    store.forget_lessons([kept])  # forgetting (retired and forgotten together) is what the rule allows
    assert store.get_lesson(kept).status == "retired"


def build_at_0006_with_a_forgotten_live_lesson(memory_url: str) -> None:
    """A database at revision 0006 as a rollback before the rule left it: lesson 2 forgotten yet active, and the
    newest live version holding it."""
    if "://" not in memory_url:
        Path(memory_url).mkdir(parents=True, exist_ok=True)
    engine = create_engine(_sql_url(memory_url))
    with engine.begin() as conn:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.attributes["connection"] = conn
        command.upgrade(config, "0006")
        tables = MetaData()
        tables.reflect(conn)
        t = tables.tables
        conn.execute(
            t["runs"].insert(),
            [
                {
                    "id": 1,
                    "name": "old",
                    "config": {},
                    "phase": "PLAY",
                    "state": {},
                    "status": "running",
                    "created_at": WHEN,
                    "updated_at": WHEN,
                }
            ],
        )
        row = {
            "run_id": 1,
            "pool": 0,
            "source_episode_ids": [],
            "metadata": {},
            "token_count": 3,
            "times_in_context": 0,
            "wins_in_context": 0,
            "created_at": WHEN,
            "updated_at": WHEN,
        }
        conn.execute(
            t["lessons"].insert(),
            [
                row | {"id": 1, "text": "Read the goal.", "status": "active", "forgotten_at": None},
                row | {"id": 2, "text": "Take the coin.", "status": "active", "forgotten_at": WHEN},
                row | {"id": 3, "text": "Go east.", "status": "consolidated", "forgotten_at": WHEN},
            ],
        )
        conn.execute(
            t["lesson_sets"].insert(),
            [
                {
                    "id": 1,
                    "run_id": 1,
                    "version": 1,
                    "status": "live",
                    "made_by": "user",
                    "note": "restored",
                    "token_count": 6,
                    "created_at": WHEN,
                }
            ],
        )
        conn.execute(
            t["lesson_set_members"].insert(),
            [{"lesson_set_id": 1, "lesson_id": i, "position": i} for i in (1, 2)],
        )
        assert current_revision(conn) == "0006"
    engine.dispose()


def test_the_migration_retires_forgotten_lessons_a_store_already_holds(memory_url: str, tmp_path: Path) -> None:
    build_at_0006_with_a_forgotten_live_lesson(memory_url)
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "index") as store:
        rows = {x.id: x for x in store.lessons(1)}
        assert {i: x.status for i, x in rows.items()} == {1: "active", 2: "retired", 3: "retired"}
        assert rows[2].forgotten_at == WHEN and rows[3].forgotten_at == WHEN  # still on record as forgotten
        assert [x.id for x in live_lessons(store, 1)[1]] == [1]  # the old live version is read without it
        with pytest.raises(InvalidRecordError, match="forgotten_retired"), store._write() as session:
            session.execute(update(Lesson).where(Lesson.id == 2).values(status="active"))
