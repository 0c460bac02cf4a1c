"""JSONL export and import of a whole store, in a versioned format whose round trip is exact.

Format (version 1), one JSON object per line:
  line 1   {"format": "agent-runtime-memory", "version": 1, "schema_revision": "0003", ...}
  then     {"table": "<table>", "row": {<column>: <value>, ...}}   tables in dependency order
  last     {"end": true, "counts": {"<table>": <rows>, ...}}
Keys are sorted (PostgreSQL's JSONB does not keep key order, so sorted keys make the text of an export
independent of the backend). Values are JSON as stored, except timestamps (ISO 8601 strings, UTC) and the
embedding vectors (base64 of the float32 bytes). Primary keys are kept, so ids inside JSON columns (an
episode's `lessons_in_context`, a lesson's `source_episode_ids`) stay valid. The trailer makes a
truncated file detectable. A row is what the store's reads return, not how it is stored: a step carries
its whole prompt (not its recipe, `memory.prompts`), a cycle its whole curves (not its appended points);
the tables derived from others (`DERIVED_TABLES`) are rebuilt by the import, not exported. Steps come in
episode order (by step index), the other tables' rows by id.

Import is all or nothing: every row goes in inside ONE transaction. Every malformed input is an `ImportFormatError`
naming the line and what is accepted (`memory.transfer_rows`): bad JSON, a file that is not UTF-8, a line longer
than `max_line_chars`, a number that is not finite (NaN, Infinity, 1e999: JSON has no such numbers and a float
column holds none), a string holding a lone surrogate (half of a UTF-16 pair: no database or tokenizer takes one),
an unknown table or column, a value of the wrong type, size or shape (a 32-bit integer, a JSON object, a list of
ids), an embedding whose bytes do not match its dimension, a reference to a row that does not exist or belongs to
another run, a missing trailer or wrong counts. A lesson whose metadata is not what the runtime writes there
(`memory.lesson_metadata`: the known keys only, ids as ids, counts as counts, rates in [0, 1], texts bounded) is an
`ImportFormatError` naming the lesson, the field, what was given and what is accepted. A lesson whose text the
caller's `lesson_screen` finds a problem with (`agent-runtime memory import` passes
`distill.lessons.safety.stored_lesson_problem`: a lesson reaches a store only through the lesson screen, and an
edited export is no exception) is an `ImportFormatError` too. A row whose id already exists is an
`ImportConflictError`. An evaluation row whose indexed fields are not what its readers take (`memory.evaluation_metrics`:
a continual assessment's phase within its run's curriculum, counts and games bounded) is an `ImportFormatError` naming
the row and the field. Rows of a run already in the store never change what that run acts with
(`memory.transfer_existing`: its lessons arrive proposed without trial evidence, its versions as candidates for the
run's gate, its adapters not active; `notes=` collects what was changed, for the person who imports). Either way the
transaction is rolled back and the store is as it was. Exports written at an
older schema revision (from 0001) are read too: their rows are brought up to date as the migrations since would have
changed them. Importing into an empty store reproduces the source exactly (`export -> import -> export` gives the
same lines after the header).

Why a screened lesson fails the whole import rather than being skipped: the rest of the file names it
(lesson-set versions the gate measured with it, episodes' `lessons_in_context`, embeddings, merges), so
leaving it out would import versions that never existed or break references; and a lesson the screen
rejects means the file was edited or written without the screen, so none of it is trusted. The error
names the line and the screen's reason; the store is as it was.

Methods on `ExperienceStore`: `export_jsonl(target) -> dict[str, int]` (a path, written atomically,
or a text file object) and `import_jsonl(source, *, max_line_chars=, lesson_screen=, notes=) -> dict[str, int]`
(a path or a text file object, e.g. `io.StringIO`); both return the row count per table (an import: the rows it
wrote).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import LargeBinary, Table, insert, select, text
from sqlalchemy.exc import StatementError
from sqlalchemy.orm import Session

from memory import migrate
from memory.errors import ImportConflictError, ImportFormatError
from memory.evaluation_metrics import curriculum_phases, evaluation_problem
from memory.lesson_metadata import lesson_metadata_problem
from memory.models import Base, CyclePoint, Run, UTCDateTime
from memory.prompts import RECIPE_COLUMNS, PromptEncoder, part_id, stored_prompts
from memory.redaction import redact_secrets
from memory.transfer_existing import ExistingRuns
from memory.transfer_rows import READABLE_REVISIONS, References, decode_row, upgrade_row

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
    "run_requests",
)
# Storage the import rebuilds from the exported rows: prompt parts (steps' recipes), lesson sources
# (lessons' source_episode_ids), cycle points (folded into a cycle's curves).
DERIVED_TABLES = ("prompt_parts", "lesson_sources", "cycle_points")
STORAGE_COLUMNS = {"steps": RECIPE_COLUMNS}  # replaced by the whole prompt in an export
BATCH_ROWS = 1000
EPISODES_PER_READ = 200
MAX_LINE_CHARS = 32 * 1024 * 1024  # the largest row this agent-runtime writes is far smaller


def _tables() -> dict[str, Table]:
    tables = {name: Base.metadata.tables[name] for name in TABLE_ORDER}
    assert set(tables) | set(DERIVED_TABLES) == set(Base.metadata.tables), "every table is exported or derived"
    return tables


def _columns(table: Table) -> list[str]:
    """The columns an export carries for `table`."""
    hidden = STORAGE_COLUMNS.get(table.name, ())
    return [c.name for c in table.columns if c.name not in hidden]


def _encode(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for column in table.columns:
        if column.name not in row:
            continue
        value = row[column.name]
        if value is not None and isinstance(column.type, UTCDateTime):
            value = value.isoformat()
        elif value is not None and isinstance(column.type, LargeBinary):
            value = base64.b64encode(value).decode("ascii")
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


class _NotFinite(ValueError):
    """A JSON number that is not a finite float (NaN, Infinity, 1e999)."""


def _no_constant(name: str) -> Any:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _parse_line(raw: str, where: str) -> Any:
    """One line's JSON, or `ImportFormatError`: not JSON, a number that is not finite, a lone surrogate."""
    try:
        item = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except _NotFinite as exc:
        raise ImportFormatError(
            f"{where}: the number {exc} is not finite; an export holds finite numbers only (NaN, Infinity, "
            "-Infinity and numbers beyond +-1.8e308, such as 1e999, are not accepted)"
        ) from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, too many digits, too deep
        raise ImportFormatError(f"{where}: not valid JSON ({getattr(exc, 'msg', exc)})") from exc
    if _SURROGATE_ESCAPE.search(raw):
        if isinstance(item, dict) and isinstance(item.get("table"), str) and isinstance(item.get("row"), dict):
            found = _lone_surrogate(item["row"], item["table"])
        else:
            found = _lone_surrogate(item, "the line")
        if found is not None:
            path, char = found
            raise ImportFormatError(
                f"{where}: {path} holds a lone surrogate (\\u{ord(char):04x}), which is not Unicode text; an "
                "export holds valid UTF-8 text only (a character beyond U+FFFF is one character, or a surrogate "
                "pair escaped as \\ud83d\\ude00)"
            )
    return item


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any, path: str) -> tuple[str, str] | None:
    """(where in `value`, the character) of the first lone surrogate in its strings and keys, or None."""
    if isinstance(value, str):
        match = _SURROGATE.search(value)
        return (path, match.group()) if match else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _lone_surrogate(key, f"{path} (a key)") or _lone_surrogate(item, f"{path}.{key}")
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{i}]")
            if found:
                return found
    return None


def _lines(source: IO[str], name: str, limit: int) -> Iterator[tuple[int, str]]:
    """(line number, line) without ever holding more than `limit` characters of one line."""
    lineno = 0
    while True:
        try:
            raw = source.readline(limit + 1)
        except UnicodeDecodeError as exc:
            raise ImportFormatError(
                f"{name}:{lineno + 1}: not UTF-8 text, at or after this line ({exc.reason}); an export is UTF-8 "
                "(was the file re-encoded?)"
            ) from None
        if not raw:
            return
        lineno += 1
        if len(raw) > limit:
            raise ImportFormatError(
                f"{name}:{lineno}: line longer than {limit} characters; no row of an export is that long "
                "(pass max_line_chars= to accept longer lines)"
            )
        yield lineno, raw


class TransferMixin:
    """JSONL export/import (see module docstring)."""

    if TYPE_CHECKING:  # provided by ExperienceStore and LessonsMixin
        url: str
        dialect: str
        _indexes: dict[str, Any]

        def _read(self) -> AbstractContextManager[Session]: ...

        def _write(self) -> AbstractContextManager[Session]: ...

        def _add_sources(self, session: Session, sources: dict[int, Any]) -> None: ...

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
                for row in self._exported_rows(session, table):
                    encoded = _encode(table, row)
                    if "config" in encoded:  # stores written before redaction may still hold secrets
                        encoded["config"] = redact_secrets(encoded["config"])
                    line = {"table": name, "row": encoded}
                    out.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")
                    counts[name] += 1
            out.write(json.dumps({"end": True, "counts": counts}) + "\n")
        return counts

    def _exported_rows(self, session: Session, table: Table) -> Iterator[dict[str, Any]]:
        """The rows of `table` as reads see them: steps with whole prompts, cycles with whole curves."""
        columns = [table.c[name] for name in _columns(table)]
        if table.name == "steps":
            yield from self._exported_steps(session, table, columns)
            return
        query = select(*columns).order_by(*table.primary_key.columns)
        for row in session.execute(query.execution_options(yield_per=BATCH_ROWS)).mappings():
            row = dict(row)
            if table.name == "opcd_cycles":
                row["curves"] = self._whole_curves(session, row["id"], row["curves"])
            yield row

    def _exported_steps(self, session: Session, table: Table, columns: list[Any]) -> Iterator[dict[str, Any]]:
        episodes = Base.metadata.tables["episodes"]
        after = 0
        conn = session.connection()
        while True:  # a batch of episodes at a time, each episode's prompts rebuilt together
            ids = session.scalars(
                select(episodes.c.id).where(episodes.c.id > after).order_by(episodes.c.id).limit(EPISODES_PER_READ)
            ).all()
            if not ids:
                return
            prompts = stored_prompts(conn, ids)
            rows = session.execute(
                select(*columns).where(table.c.episode_id.in_(ids)).order_by(table.c.episode_id, table.c.step_index)
            ).mappings()
            for row in rows:
                yield {**row, "prompt": prompts[(row["episode_id"], row["step_index"])]}
            after = ids[-1]

    @staticmethod
    def _whole_curves(session: Session, cycle_id: int, curves: dict[str, Any]) -> dict[str, Any]:
        points = session.scalars(
            select(CyclePoint.metrics).where(CyclePoint.cycle_id == cycle_id).order_by(CyclePoint.step)
        ).all()
        if not points:
            return curves
        whole = {k: list(v) if isinstance(v, list) else v for k, v in (curves or {}).items()}
        for values in points:
            for key, value in values.items():
                if not isinstance(whole.get(key), list):
                    whole[key] = []
                whole[key].append(value)
        return whole

    def import_jsonl(
        self,
        source: str | os.PathLike[str] | IO[str],
        *,
        max_line_chars: int = MAX_LINE_CHARS,
        lesson_screen: Callable[[str], str | None] | None = None,
        notes: list[str] | None = None,
    ) -> dict[str, int]:
        """Add every row of a JSONL export to this store, all or nothing; returns rows written per table.
        `lesson_screen(text)` says what is wrong with a lesson's text (None: nothing); a lesson it finds a
        problem with fails the import (see the module docstring for why it is not skipped). `notes` gets a line
        per change made to rows of runs already in the store (`memory.transfer_existing`)."""
        if hasattr(source, "read"):
            name = str(getattr(source, "name", None) or "<stream>")
        else:
            name = os.fspath(source)  # type: ignore[arg-type]
        tables = _tables()
        counts = {t: 0 for t in tables}
        written = dict(counts)
        with self._write() as session, _open_text(source, "r") as lines:
            importer = _Importer(self, session, tables, name)
            trailer: dict[str, Any] | None = None
            revision = ""
            lineno = 0
            for lineno, raw in _lines(lines, name, max_line_chars):
                where = f"{name}:{lineno}"
                if trailer is not None:
                    raise ImportFormatError(f"{where}: content after the end marker")
                item = _parse_line(raw, where)
                if not isinstance(item, dict):
                    raise ImportFormatError(f"{where}: expected a JSON object")
                if lineno == 1:
                    revision = self._check_header(item, where)
                    continue
                if item.get("end") is True:
                    trailer = item
                    continue
                table_name = item.get("table")
                if table_name not in tables or not isinstance(item.get("row"), dict):
                    raise ImportFormatError(
                        f'{where}: expected {{"table": one of {", ".join(TABLE_ORDER)}, '
                        f'"row": {{...}}}}, got keys {sorted(item)}'
                    )
                table = tables[table_name]
                row = decode_row(table, upgrade_row(revision, table_name, item["row"]), where, _columns(table))
                if table_name == "lessons" and (problem := lesson_metadata_problem(row["metadata"])):
                    raise ImportFormatError(
                        f"{where}: lesson {row['id']}: {problem}; nothing was imported (a lesson's metadata holds "
                        "what the runtime writes there, memory.lesson_metadata)"
                    )
                if table_name == "lessons" and lesson_screen is not None:
                    problem = lesson_screen(row["text"])
                    if problem:
                        raise ImportFormatError(
                            f"{where}: lesson {row['id']} is rejected by the lesson safety screen ({problem}); a "
                            "lesson enters a store only through the screen, so nothing was imported (remove or "
                            "fix that lesson, and the rows that name it, and import again)"
                        )
                if table_name == "evaluations" and (problem := importer.evaluation_problem(row)):
                    raise ImportFormatError(
                        f"{where}: evaluation {row['id']}: {problem}; nothing was imported (readers index with it)"
                    )
                counts[table_name] += 1
                admitted = importer.existing.admit(table_name, row, where)
                if admitted is not None:
                    importer.add(table_name, admitted, lineno)
                    written[table_name] += 1
            if lineno == 0:
                raise ImportFormatError(f"{name}:1: empty file, expected the format header")
            importer.flush()
            if trailer is None:
                raise ImportFormatError(f"{name}:{lineno + 1}: missing end marker; the file is truncated")
            expected = trailer.get("counts")
            # a table newer than the export (none of its rows, not in its counts) is not a mismatch
            read = {t: n for t, n in counts.items() if n or (isinstance(expected, dict) and t in expected)}
            if expected != read:
                raise ImportFormatError(f"{name}: end marker counts {expected} do not match the rows read {read}")
            importer.finish(counts)
        self._indexes.clear()
        if notes is not None:
            notes.extend(importer.existing.notes())
        return written

    @staticmethod
    def _check_header(item: dict[str, Any], where: str) -> str:
        """The export's schema revision, once the header says this code can read it."""
        if item.get("format") != FORMAT_NAME:
            raise ImportFormatError(f"{where}: not an agent-runtime memory export (no format header)")
        version = item.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ImportFormatError(
                f"{where}: export format version {version!r} is newer than this agent-runtime reads "
                f"({FORMAT_VERSION}); upgrade agent-runtime"
            )
        revision = item.get("schema_revision")
        assert READABLE_REVISIONS[-1] == migrate.head_revision(), "transfer_rows must know the newest revision"
        if revision not in READABLE_REVISIONS:
            raise ImportFormatError(
                f"{where}: export of schema revision {revision!r}; this agent-runtime imports revisions "
                f"{', '.join(READABLE_REVISIONS)} (a newer export needs a newer agent-runtime)"
            )
        return revision


class _Importer:
    """Rows of one import going into the store: batched per table, in the tables' order, steps stored as
    recipes, lessons' sources as rows, and every reference checked at the end."""

    def __init__(self, store: Any, session: Session, tables: dict[str, Table], name: str) -> None:
        self.store, self.session, self.tables, self.name = store, session, tables, name
        self.pending: list[tuple[int, dict[str, Any]]] = []
        self.pending_table: str | None = None
        self.order_pos = 0
        self.references = References()
        self.encoder = PromptEncoder(max_episodes=10_000)
        self.parts: dict[str, int] = {}
        self.embedding_dims: dict[str, tuple[int, str]] = {}
        self.existing = ExistingRuns(set(session.scalars(select(Run.id))))
        self.phases: dict[int | None, int | None] = {None: None}  # run -> its curriculum's number of phases

    def evaluation_problem(self, row: dict[str, Any]) -> str | None:
        """What is wrong with an evaluation row's indexed fields, given its run's curriculum (in the file or the
        store), or None."""
        run = row["run_id"]
        if run not in self.phases:
            self.phases[run] = curriculum_phases(self.session.scalar(select(Run.config).where(Run.id == run)))
        return evaluation_problem(row["num_episodes"], row["metrics"], self.phases[run])

    def add(self, table_name: str, row: dict[str, Any], lineno: int) -> None:
        where = f"{self.name}:{lineno}"
        position = TABLE_ORDER.index(table_name)
        if position < self.order_pos:
            raise ImportFormatError(
                f"{where}: table {table_name} after {TABLE_ORDER[self.order_pos]}; "
                f"tables must come in the order {', '.join(TABLE_ORDER)}"
            )
        self.order_pos = position
        self.references.note(table_name, row, where)
        if table_name == "runs":
            self.phases[row["id"]] = curriculum_phases(row["config"])
        if table_name == "embeddings":
            self._check_dim(row, where)
        if table_name == "steps":
            recipe = self.encoder.encode(row["episode_id"], row["step_index"], row["observation"], row["prompt"])
            part = part_id(self.session.connection(), recipe.part, self.parts) if recipe.part is not None else None
            row = row | recipe.columns(part)
        if self.pending and (self.pending_table != table_name or len(self.pending) >= BATCH_ROWS):
            self.flush()
        self.pending_table = table_name
        self.pending.append((lineno, row))

    def _check_dim(self, row: dict[str, Any], where: str) -> None:
        """Every vector of one embedder has one size (the index is built from all of them)."""
        model = row["model"]
        if model not in self.embedding_dims:
            embeddings = self.tables["embeddings"]
            stored = self.session.scalar(select(embeddings.c.dim).where(embeddings.c.model == model).limit(1))
            self.embedding_dims[model] = (stored, "the store") if stored is not None else (row["dim"], where)
        dim, seen = self.embedding_dims[model]
        if row["dim"] != dim:
            raise ImportFormatError(
                f"{where}: embeddings.dim {row['dim']} for embedder {model!r}, whose vectors have dim {dim} "
                f"(from {seen}); one embedder's vectors all have one size"
            )

    def flush(self) -> None:
        if not self.pending:
            return
        table = self.tables[self.pending_table]  # type: ignore[index]
        _insert_batch(self.store, self.session, table, self.pending, self.name)
        if table.name == "lessons":
            self.store._add_sources(self.session, {row["id"]: row["source_episode_ids"] for _, row in self.pending})
        self.pending = []

    def finish(self, counts: dict[str, int]) -> None:
        """References checked, no forgotten lesson back in a version, sequences moved past the imported ids
        (PostgreSQL)."""
        self.references.check(self.session, self.tables, self.name)
        self.existing.check_versions(self.session, self.name)
        if self.store.dialect == "postgresql":
            for table in self.tables.values():
                if "id" in table.columns and counts[table.name]:
                    self.session.execute(
                        text(
                            f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                            f"(SELECT max(id) FROM {table.name}))"
                        )
                    )


def _insert_batch(
    store: Any, session: Session, table: Table, batch: list[tuple[int, dict[str, Any]]], name: str
) -> None:
    keys = list(table.primary_key.columns)
    if len(keys) == 1:
        key = keys[0]
        wanted = {row[key.name]: lineno for lineno, row in batch}
        existing = session.scalars(select(key).where(key.in_(list(wanted)))).all()
        if existing:
            first = min(wanted[i] for i in existing)
            raise ImportConflictError(
                f"{name}:{first}: {table.name} id {existing[0]} already exists in {store.url}; "
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
