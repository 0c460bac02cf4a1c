"""Turning a store target (a workdir, a file or a URL) into a configured SQLAlchemy engine.

SQLite (the default, `<workdir>/memory.db`):
- WAL journal, so readers (the dashboard) never block the writer and a SIGKILLed writer leaves the
  last committed transaction intact; `synchronous=NORMAL`, which in WAL mode is safe against process
  crashes (only a power cut can lose the newest commits, never corrupt the file).
- a busy timeout, so two processes wait for each other instead of failing at once;
- foreign keys on (SQLite leaves them off by default);
- write transactions start with `BEGIN IMMEDIATE`: taking the write lock up front means a writer
  never has to upgrade a read lock, which is where SQLite otherwise fails with "database is locked"
  without honouring the busy timeout.
- read-only opens use the `mode=ro` URI, so nothing (not even a journal) is created.

A file that exists but does not start with SQLite's magic header is rejected before SQLite touches it,
so a wrong path can never be "repaired" into an empty database.

PostgreSQL (`postgresql+psycopg://...`): pre-ping on the pool; read-only opens set
`default_transaction_read_only`, so the server itself refuses writes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

from memory.errors import InvalidRecordError, NotADatabaseError, StoreUnavailableError

DB_FILENAME = "memory.db"
SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 30_000


NUL_REPLACEMENT = "\ufffd"  # what a NUL character in text becomes: PostgreSQL cannot store NUL in text or JSONB


def without_nul(text: str) -> str:
    return text.replace("\x00", NUL_REPLACEMENT)


def _storable(value: Any) -> Any:
    """`value` with NaN and infinities as None and NUL characters replaced, in keys and strings too."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return without_nul(value)
    if isinstance(value, dict):
        return {without_nul(k) if isinstance(k, str) else k: _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value


def json_dumps(value: Any) -> str:
    """JSON for the JSON columns: NaN and infinities become null and NUL characters U+FFFD (PostgreSQL's
    JSONB holds neither, and both backends must store the same thing); a value JSON cannot hold is
    `InvalidRecordError`."""
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError:
        text = json.dumps(_storable(value), allow_nan=False)
    except TypeError as exc:
        raise InvalidRecordError(f"a value cannot be stored as JSON: {exc}") from exc
    if "\\u0000" in text:
        text = json.dumps(_storable(value), allow_nan=False)
    return text


def resolve_url(target: str | os.PathLike[str]) -> URL:
    """A SQLAlchemy URL for a workdir, an SQLite file path or a URL.

    A directory (existing or not) means `<dir>/memory.db`; an existing file, or a path ending in
    `.db`/`.sqlite`/`.sqlite3`, means that file. A workdir's `memory.db` is the runtime's own file: when it is a
    symbolic link it is refused (the store would read and write the link's target), while a database file a
    user names directly may be a link.
    """
    text = os.fspath(target)
    if "://" in text:
        return make_url(text)
    path = Path(text).expanduser()
    if not path.is_file() and path.suffix not in {".db", ".sqlite", ".sqlite3"}:
        path = path / DB_FILENAME
        if path.is_symlink():
            raise StoreUnavailableError(
                f"{path} is a symbolic link (to {os.readlink(path)}); the runtime never writes through one: remove "
                "the link, or name the database file itself (--db)"
            )
    return URL.create("sqlite+pysqlite", database=str(path.resolve()))


def describe(url: URL) -> str:
    """The URL for messages: the file path for SQLite, the URL with the password hidden otherwise."""
    if url.get_backend_name() == "sqlite":
        return url.database or ":memory:"
    return url.render_as_string(hide_password=True)


def check_sqlite_file(path: Path) -> None:
    """Refuse a file that exists, is not empty and is not an SQLite database (without writing to it).

    SQLite reads the header itself, on a read-only connection (which creates nothing next to a file that is
    not a database). A descriptor of our own on a database file would, when closed, drop every POSIX lock
    this process's connections hold on it (SQLite's "How To Corrupt An SQLite Database File", 2.2): a second
    store opened in a process would take the first one's SHARED lock away, and another process closing its
    last connection would then checkpoint and delete the WAL under the first store's connections (their
    reads go stale; their commits go to an unlinked file). Only a file SQLite refuses is read here.
    """
    import sqlite3

    if not path.exists():
        return
    if path.is_dir():
        raise NotADatabaseError(f"{path} is a directory, not a database file")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        conn.execute("PRAGMA schema_version")
    except sqlite3.DatabaseError as exc:
        if "not a database" not in str(exc):
            return  # busy, locked, ...: the store's own open reports it
        with path.open("rb") as fh:  # not a database, so no connection of ours holds a lock on it
            head = fh.read(len(SQLITE_MAGIC))
        raise NotADatabaseError(
            f"{path} is not an SQLite database (its first bytes are {head[:8]!r}); "
            "point the store at a workdir or at a memory.db file"
        ) from None
    finally:
        conn.close()


def _sqlite_engine(url: URL, read_only: bool) -> Engine:
    database = url.database
    if database and database != ":memory:":
        path = Path(database)
        check_sqlite_file(path)
        if read_only:
            if not path.exists():
                raise StoreUnavailableError(f"no memory database at {path}; nothing to read")
            url = URL.create(
                "sqlite+pysqlite",
                database=f"file:{path}?mode=ro",
                query={"uri": "true"},
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000}, json_serializer=json_dumps)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let us emit BEGIN ourselves (pysqlite's implicit transactions defer it unpredictably).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if not read_only:
            _enable_wal(cursor)
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate and not read_only else "BEGIN")

    return engine


def _postgres_engine(url: URL, read_only: bool) -> Engine:
    connect_args: dict[str, Any] = {"connect_timeout": 10}
    if read_only:
        connect_args["options"] = "-c default_transaction_read_only=on"
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args, json_serializer=json_dumps)


def _enable_wal(cursor: Any) -> None:
    """Switch to WAL. Turning WAL on takes an exclusive lock without calling SQLite's busy handler, so
    processes opening a new database together can see "database is locked" here: retry with backoff."""
    import sqlite3
    import time

    for attempt in range(40):
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == 39:
                raise
            time.sleep(min(0.01 * (attempt + 1), 0.25))


def make_engine(url: URL, *, read_only: bool = False) -> Engine:
    """A configured engine for the URL (see the module docstring for what is configured)."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, read_only)
    if backend == "postgresql":
        return _postgres_engine(url, read_only)
    raise StoreUnavailableError(
        f"unsupported database backend {backend!r} in {describe(url)}; "
        "use a workdir, an SQLite file, sqlite:///PATH or postgresql+psycopg://USER:PASS@HOST/DB"
    )
