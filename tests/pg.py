"""PostgreSQL for the memory tests: where the test server is, and whether to skip or fail without it.

The URL comes from AGENT_RUNTIME_TEST_PG_URL (default: the server `.ci/postgres.sh` starts). On a
developer machine without a server the PostgreSQL tests skip with the reason; in CI (the `CI`
environment variable set) they fail instead, because there the server must be running.

Each test process works in its own database (`<name>_<pid>`, created when the role may create
databases, dropped at exit), so two test runs against one server cannot reset each other's tables.
"""

from __future__ import annotations

import atexit
import functools
import os

import pytest
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import SQLAlchemyError

PG_URL_ENV = "AGENT_RUNTIME_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg://agent:agent@127.0.0.1:5432/agent_test"


def pg_url() -> str:
    return os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL


@functools.cache
def _unreachable_reason(url: str) -> str | None:
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
        return None
    except SQLAlchemyError as exc:  # any failure to connect is a reason to skip (or fail in CI)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        engine.dispose()


@functools.cache
def _private_database(url: str) -> str:
    """A database of this process's own on the same server, or `url` if it cannot be created."""
    base = make_url(url)
    name = f"{base.database}_{os.getpid()}"
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError:
        return url  # no CREATEDB privilege: share the configured database
    finally:
        engine.dispose()
    atexit.register(_drop_database, url, name)
    return base.set(database=name).render_as_string(hide_password=False)


def _drop_database(url: str, name: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    except SQLAlchemyError:
        pass  # best effort at interpreter exit
    finally:
        engine.dispose()


def require_pg() -> str:
    """A URL of a test database; skips the test (fails it in CI) when no server answers."""
    url = pg_url()
    reason = _unreachable_reason(url)
    if reason is not None:
        message = (
            f"PostgreSQL not reachable at {make_url(url).render_as_string(hide_password=True)} "
            f"({reason}); start one with "
            f"`source .ci/postgres.sh` or set {PG_URL_ENV}"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return _private_database(url)


def reset_pg(url: str) -> None:
    """Drop everything in the test database's public schema (the role owns it)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()
