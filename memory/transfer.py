"""JSONL export and import of a whole store, in a versioned format whose round trip is exact.

Format (version 1), one JSON object per line:
  line 1   {"format": "agent-runtime-memory", "version": 1, "schema_revision": "0001", ...}
  then     {"table": "<table>", "row": {<column>: <value>, ...}}   tables in dependency order, rows by id
  last     {"end": true, "counts": {"<table>": <rows>, ...}}
Keys are sorted (PostgreSQL's JSONB does not keep key order, so sorted keys make the text of
an export independent of the backend). Values are JSON as stored, except timestamps (ISO 8601 strings, UTC) and the embedding vectors
(base64 of the float32 bytes). Primary keys are kept, so ids inside JSON columns (an episode's
`lessons_in_context`, a lesson's `source_episode_ids`) stay valid. The trailer makes a truncated
file detectable.

Import is all or nothing: every row goes in inside ONE transaction; a malformed line (bad JSON,
unknown table or column, wrong type, missing trailer or wrong counts) raises `ImportFormatError`
naming the line, and a row whose id already exists raises `ImportConflictError`; either way the
transaction is rolled back and the store is as it was. Importing into an empty store reproduces the
source exactly (`export -> import -> export` gives the same lines after the header).

Methods on `ExperienceStore`: `export_jsonl(target) -> dict[str, int]` (a path, written atomically,
or a text file object) and `import_jsonl(source) -> dict[str, int]` (a path or a text file object);
both return the row count per table.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import Boolean, Float, Integer, LargeBinary, Table, insert, select, text
from sqlalchemy.exc import StatementError
from sqlalchemy.orm import Session

from memory import migrate
from memory.errors import ImportConflictError, ImportFormatError
from memory.models import Base, UTCDateTime
from memory.redaction import redact_secrets

FORMAT_NAME = "agent-runtime-memory"
FORMAT_VERSION = 1
TABLE_ORDER = (
    "runs",
    "adapters",
    "extractions",
    "opcd_cycles",
    "lessons",
    "lesson_sets",
    "lesson_set_members",
    "episodes",
    "steps",
    "evaluations",
    "embeddings",
)
BATCH_ROWS = 1000


def _tables() -> dict[str, Table]:
    tables = {name: Base.metadata.tables[name] for name in TABLE_ORDER}
    assert set(tables) == set(Base.metadata.tables), "every table must be exported"
    return tables


def _encode(table: Table, row: Any) -> dict[str, Any]:
    out = {}
    for column in table.columns:
        value = row._mapping[column]
        if value is not None and isinstance(column.type, UTCDateTime):
            value = value.isoformat()
        elif value is not None and isinstance(column.type, LargeBinary):
            value = base64.b64encode(value).decode("ascii")
        out[column.name] = value
    return out


def _decode(table: Table, row: dict[str, Any], where: str) -> dict[str, Any]:
    names = {c.name for c in table.columns}
    if set(row) != names:
        raise ImportFormatError(
            f"{where}: columns of {table.name} do not match (unknown: "
            f"{sorted(set(row) - names)}, missing: {sorted(names - set(row))})"
        )
    out = {}
    for column in table.columns:
        value = row[column.name]
        if value is None:
            if not column.nullable:
                raise ImportFormatError(f"{where}: {table.name}.{column.name} may not be null")
        elif isinstance(column.type, UTCDateTime):
            try:
                value = dt.datetime.fromisoformat(value)
            except (TypeError, ValueError) as exc:
                raise ImportFormatError(f"{where}: {table.name}.{column.name}: {exc}") from exc
        elif isinstance(column.type, LargeBinary):
            try:
                value = base64.b64decode(value, validate=True)
            except (TypeError, ValueError) as exc:
                raise ImportFormatError(f"{where}: {table.name}.{column.name}: bad base64") from exc
        elif isinstance(column.type, Boolean) and not isinstance(value, bool):
            raise ImportFormatError(f"{where}: {table.name}.{column.name} must be true or false")
        elif isinstance(column.type, Integer) and (type(value) is not int):
            raise ImportFormatError(f"{where}: {table.name}.{column.name} must be an integer")
        elif isinstance(column.type, Float) and type(value) not in (int, float):
            raise ImportFormatError(f"{where}: {table.name}.{column.name} must be a number")
        out[column.name] = value
    return out


@contextmanager
def _open_text(target: str | os.PathLike[str] | IO[str], mode: str) -> Iterator[IO[str]]:
    if hasattr(target, "write" if mode == "w" else "read"):
        yield target  # type: ignore[misc]
        return
    path = Path(target)  # type: ignore[arg-type]
    if mode == "r":
        with path.open("r", encoding="utf-8") as fh:
            yield fh
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class TransferMixin:
    """JSONL export/import (see module docstring)."""

    if TYPE_CHECKING:  # provided by ExperienceStore
        url: str
        dialect: str
        _indexes: dict[str, Any]

        def _read(self) -> AbstractContextManager[Session]: ...

        def _write(self) -> AbstractContextManager[Session]: ...

    def export_jsonl(self, target: str | os.PathLike[str] | IO[str]) -> dict[str, int]:
        """Write the whole store as JSONL (format version 1); returns rows per table."""
        counts: dict[str, int] = {}
        with self._read() as session, _open_text(target, "w") as out:
            header = {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "schema_revision": migrate.head_revision(),
                "exported_at": dt.datetime.now(dt.UTC).isoformat(),
                "source": self.url,
            }
            out.write(json.dumps(header) + "\n")
            for name, table in _tables().items():
                counts[name] = 0
                query = select(table).order_by(*table.primary_key.columns)
                for row in session.execute(query.execution_options(yield_per=BATCH_ROWS)):
                    encoded = _encode(table, row)
                    if "config" in encoded:  # stores written before redaction may still hold secrets
                        encoded["config"] = redact_secrets(encoded["config"])
                    line = {"table": name, "row": encoded}
                    out.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")
                    counts[name] += 1
            out.write(json.dumps({"end": True, "counts": counts}) + "\n")
        return counts

    def import_jsonl(self, source: str | os.PathLike[str] | IO[str]) -> dict[str, int]:
        """Add every row of a JSONL export to this store, all or nothing; returns rows per table."""
        name = getattr(source, "name", None) or os.fspath(source)  # type: ignore[arg-type]
        tables = _tables()
        counts = {t: 0 for t in tables}
        with self._write() as session, _open_text(source, "r") as lines:
            pending: list[tuple[int, dict[str, Any]]] = []
            pending_table: str | None = None
            order_pos = 0
            trailer: dict[str, Any] | None = None
            lineno = 0
            for lineno, raw in enumerate(lines, start=1):
                where = f"{name}:{lineno}"
                if trailer is not None:
                    raise ImportFormatError(f"{where}: content after the end marker")
                try:
                    item = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise ImportFormatError(f"{where}: not valid JSON ({exc.msg})") from exc
                if not isinstance(item, dict):
                    raise ImportFormatError(f"{where}: expected a JSON object")
                if lineno == 1:
                    self._check_header(item, where)
                    continue
                if item.get("end") is True:
                    trailer = item
                    continue
                table_name = item.get("table")
                if table_name not in tables or not isinstance(item.get("row"), dict):
                    raise ImportFormatError(
                        f"{where}: expected {{\"table\": one of {', '.join(TABLE_ORDER)}, "
                        f"\"row\": {{...}}}}, got keys {sorted(item)}"
                    )
                position = TABLE_ORDER.index(table_name)
                if position < order_pos:
                    raise ImportFormatError(
                        f"{where}: table {table_name} after {TABLE_ORDER[order_pos]}; "
                        f"tables must come in the order {', '.join(TABLE_ORDER)}"
                    )
                order_pos = position
                row = _decode(tables[table_name], item["row"], where)
                if pending and (pending_table != table_name or len(pending) >= BATCH_ROWS):
                    self._insert_batch(session, tables[pending_table], pending, name)  # type: ignore[index]
                    pending = []
                pending_table = table_name
                pending.append((lineno, row))
                counts[table_name] += 1
            if lineno == 0:
                raise ImportFormatError(f"{name}:1: empty file, expected the format header")
            if pending:
                self._insert_batch(session, tables[pending_table], pending, name)  # type: ignore[index]
            if trailer is None:
                raise ImportFormatError(
                    f"{name}:{lineno + 1}: missing end marker; the file is truncated"
                )
            if trailer.get("counts") != counts:
                raise ImportFormatError(
                    f"{name}: end marker counts {trailer.get('counts')} do not match the rows read {counts}"
                )
            if self.dialect == "postgresql":
                for table in tables.values():
                    if "id" in table.columns and counts[table.name]:
                        session.execute(
                            text(
                                f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                                f"(SELECT max(id) FROM {table.name}))"
                            )
                        )
        self._indexes.clear()
        return counts

    @staticmethod
    def _check_header(item: dict[str, Any], where: str) -> None:
        if item.get("format") != FORMAT_NAME:
            raise ImportFormatError(f"{where}: not an agent-runtime memory export (no format header)")
        version = item.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ImportFormatError(
                f"{where}: export format version {version!r} is newer than this agent-runtime reads "
                f"({FORMAT_VERSION}); upgrade agent-runtime"
            )
        if item.get("schema_revision") != migrate.head_revision():
            raise ImportFormatError(
                f"{where}: export of schema revision {item.get('schema_revision')!r}; this "
                f"agent-runtime imports revision {migrate.head_revision()!r} only"
            )

    def _insert_batch(
        self, session: Session, table: Table, batch: list[tuple[int, dict[str, Any]]], name: str
    ) -> None:
        keys = list(table.primary_key.columns)
        if len(keys) == 1:
            key = keys[0]
            wanted = {row[key.name]: lineno for lineno, row in batch}
            existing = session.scalars(select(key).where(key.in_(list(wanted)))).all()
            if existing:
                first = min(wanted[i] for i in existing)
                raise ImportConflictError(
                    f"{name}:{first}: {table.name} id {existing[0]} already exists in {self.url}; "
                    "import into an empty store (nothing was imported)"
                )
        try:
            with session.begin_nested():
                session.execute(insert(table), [row for _, row in batch])
            return
        except StatementError as batch_error:
            error: BaseException = batch_error
        # Find the first row the database rejects, to name its line (each try in a savepoint).
        for lineno, row in batch:
            try:
                with session.begin_nested():
                    session.execute(insert(table), [row])
            except StatementError as row_error:
                raise ImportFormatError(
                    f"{name}:{lineno}: row of {table.name} rejected by the database: "
                    f"{str(getattr(row_error, 'orig', row_error)).splitlines()[0]}"
                ) from row_error
        raise ImportFormatError(
            f"{name}:{batch[0][0]}-{batch[-1][0]}: rows of {table.name} rejected by the database: "
            f"{str(getattr(error, 'orig', error)).splitlines()[0]}"
        ) from error
