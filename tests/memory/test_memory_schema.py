"""The schema: migrations agree with the ORM classes; foreign and too-new databases are refused."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, text

from memory import DatabaseTooNewError, ExperienceStore, NotADatabaseError
from memory.migrate import head_revision
from memory.models import Base


def test_migrations_match_the_models(memory_url: str) -> None:
    ExperienceStore.open(memory_url).close()
    url = memory_url if "://" in memory_url else f"sqlite:///{memory_url}/memory.db"
    engine = create_engine(url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
        assert context.get_current_revision() == head_revision()
    engine.dispose()


def test_database_newer_than_the_code_is_a_clear_error(memory_url: str) -> None:
    ExperienceStore.open(memory_url).close()
    url = memory_url if "://" in memory_url else f"sqlite:///{memory_url}/memory.db"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    engine.dispose()
    with pytest.raises(DatabaseTooNewError, match="'9999_future'.*upgrade agent-runtime"):
        ExperienceStore.open(memory_url)
    with pytest.raises(DatabaseTooNewError):
        ExperienceStore.open(memory_url, read_only=True)


@pytest.mark.parametrize("content", [b"hello, this is not a database\n" * 50, b"\x00" * 4096])
def test_non_database_file_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "memory.db"
    path.write_bytes(content)
    with pytest.raises(NotADatabaseError, match="not an SQLite database"):
        ExperienceStore.open(path)
    with pytest.raises(NotADatabaseError):
        ExperienceStore.open(tmp_path, read_only=True)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.db"]


def test_corrupt_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    with ExperienceStore.open(tmp_path) as opened:
        opened.create_run("r", {})
    path = tmp_path / "memory.db"
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # smash the schema page after the valid header
    path.write_bytes(bytes(data))
    for name in ("memory.db-wal", "memory.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    with pytest.raises(NotADatabaseError, match="not a readable SQLite database"):
        ExperienceStore.open(tmp_path)
    assert path.read_bytes() == bytes(data)


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE invoices (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(NotADatabaseError, match="not an agent-runtime memory.*invoices"):
        ExperienceStore.open(path)


def test_processes_opening_a_new_database_together_all_succeed(memory_url: str) -> None:
    errors: list[BaseException] = []

    def open_and_write(i: int) -> None:
        try:
            with ExperienceStore.open(memory_url) as opened:
                opened.create_run(f"r{i}", {})
        except Exception as exc:  # noqa: BLE001 -- collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_and_write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with ExperienceStore.open(memory_url) as opened:
        assert sorted(r.name for r in opened.runs()) == ["r0", "r1", "r2", "r3"]
