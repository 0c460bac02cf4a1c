"""PostgreSQL for the memory tests: where the test server is, and whether to skip or fail without it.

The URL comes from AGENT_RUNTIME_TEST_PG_URL (default: the server `.ci/postgres.sh` starts). On a
developer machine without a server the PostgreSQL tests skip with the reason; in CI (the `CI`
environment variable set) they fail instead, because there the server must be running.
"""

from __future__ import annotations

import functools
import os

import pytest
from sqlalchemy import create_engine, text
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


def require_pg() -> str:
    """The test server's URL; skips the test (fails it in CI) when no server answers."""
    url = pg_url()
    reason = _unreachable_reason(url)
    if reason is not None:
        message = (
            f"PostgreSQL not reachable at {url} ({reason}); start one with "
            f"`source .ci/postgres.sh` or set {PG_URL_ENV}"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return url


def reset_pg(url: str) -> None:
    """Drop everything in the test database's public schema (the role owns it)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()
