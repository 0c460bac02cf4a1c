"""What an imported row must be: values checked, rows of older exports brought up to date, references checked.

Why a module of its own: an export is data from elsewhere (another machine, another version, a person's
editor), and the importer must turn every malformed value into a line-numbered `ImportFormatError`
before the database sees it, never a driver's OverflowError, never a row the store would not have
written itself. `memory.transfer` reads lines; this module says what a line may contain:

- `decode_row(table, row, where)`: every column present and nothing else; integers 32-bit (PostgreSQL's INTEGER, and
  what SQLite can bind), numbers finite (no NaN, no infinity), booleans booleans, strings strings within their length,
  timestamps ISO 8601, binary base64, JSON columns of their shape (`JSON_SHAPES`: an object, a list of ids, a list of
  strings or null), embeddings whose bytes are `4 * dim` finite floats.
- `upgrade_row(revision, table, row)`: a row of an export written at an older schema revision, as that
  revision's migrations would have left it (0001 -> 0002 reads the lesson-set notes with migration 0002's
  own rules, imported from it; 0002 -> 0003 gives cycles their empty `episode_ids`; 0003 -> 0004 lessons
  their null `forgotten_at`; 0004 -> 0005 episodes and adapters their null fingerprints; 0005 -> 0006 lessons the
  scope `["*"]`, every environment, where they were shown before scopes; 0006 -> 0007 a forgotten lesson retired, as
  migration 0007 repairs one).
- `References`: the ids a row names in JSON lists and foreign keys, checked once every row is in (same
  transaction): the row named must exist (a lesson's or cycle's source episodes may have been pruned,
  if their ids are below the store's newest episode) and belong to the same run, or to none.
"""

from __future__ import annotations

import base64
import datetime as dt
import importlib.util
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
from sqlalchemy import JSON, Boolean, Column, Float, Integer, LargeBinary, String, Table, TypeDecorator, func, select
from sqlalchemy.orm import Session

from memory.errors import ImportFormatError, InvalidRecordError
from memory.lesson_store import check_scope
from memory.migrate import MIGRATIONS_DIR
from memory.models import UTCDateTime

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
MAX_EMBEDDING_DIM = 65_536
LOOKUP_CHUNK = 900

OBJECT, IDS, STRINGS_OR_NULL = "a JSON object", "a list of integer ids", "a list of strings, or null"
SCOPE = "a list of 1-64 environment ids, family:NAME or '*' (each 1-200 characters)"
JSON_SHAPES = {
    ("runs", "config"): OBJECT,
    ("runs", "state"): OBJECT,
    ("adapters", "metadata"): OBJECT,
    ("extractions", "episode_ids"): IDS,
    ("extractions", "metadata"): OBJECT,
    ("opcd_cycles", "config"): OBJECT,
    ("opcd_cycles", "metrics"): OBJECT,
    ("opcd_cycles", "curves"): OBJECT,
    ("opcd_cycles", "episode_ids"): IDS,
    ("lessons", "source_episode_ids"): IDS,
    ("lessons", "metadata"): OBJECT,
    ("lessons", "scope"): SCOPE,
    ("episodes", "lessons_in_context"): IDS,
    ("episodes", "metadata"): OBJECT,
    ("steps", "admissible_actions"): STRINGS_OR_NULL,
    ("steps", "info"): OBJECT,
    ("evaluations", "metrics"): OBJECT,
}
# (table, column) -> (the table it names, whether a missing row is allowed: provenance of pruned episodes)
JSON_REFERENCES = {
    ("episodes", "lessons_in_context"): ("lessons", False),
    ("lessons", "source_episode_ids"): ("episodes", True),
    ("extractions", "episode_ids"): ("episodes", True),
    ("opcd_cycles", "episode_ids"): ("episodes", True),
}
# foreign keys whose target must be of the same run (the database checks that it exists)
RUN_KEYS = {
    ("adapters", "parent_id"): "adapters",
    ("opcd_cycles", "base_adapter_id"): "adapters",
    ("opcd_cycles", "adapter_id"): "adapters",
    ("lessons", "extraction_id"): "extractions",
    ("lessons", "consolidated_cycle_id"): "opcd_cycles",
    ("episodes", "adapter_id"): "adapters",
    ("evaluations", "adapter_id"): "adapters",
    ("evaluations", "cycle_id"): "opcd_cycles",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _scope_ok(value: Any) -> bool:
    try:
        check_scope(value)
    except InvalidRecordError:
        return False
    return True


def _check_json(table: str, column: str, value: Any, where: str) -> None:
    shape = JSON_SHAPES.get((table, column))
    ok = (
        shape is None
        or (shape == OBJECT and isinstance(value, dict))
        or (shape == IDS and isinstance(value, list) and all(_is_int(v) and 1 <= v <= INT_MAX for v in value))
        or (
            shape == STRINGS_OR_NULL
            and (value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value)))
        )
        or (shape == SCOPE and _scope_ok(value))
    )
    if not ok:
        raise ImportFormatError(f"{where}: {table}.{column} must be {shape}, got {_show(value)}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def decode_row(table: Table, row: dict[str, Any], where: str, columns: Iterable[str]) -> dict[str, Any]:
    """The row as insertable values, or `ImportFormatError` naming the line and what is accepted.
    `columns` are the ones an export carries for this table."""
    names = set(columns)
    if set(row) != names:
        raise ImportFormatError(
            f"{where}: columns of {table.name} do not match (unknown: "
            f"{sorted(set(row) - names)}, missing: {sorted(names - set(row))})"
        )
    out = {}
    for column in table.columns:
        if column.name in names:
            out[column.name] = _value(table.name, column, row[column.name], where)
    if table.name == "embeddings":
        _check_vector(out, where)
    return out


def _value(table: str, column: Column[Any], value: Any, where: str) -> Any:
    what = f"{where}: {table}.{column.name}"
    kind = column.type
    base = kind.impl if isinstance(kind, TypeDecorator) and not isinstance(kind, UTCDateTime) else kind
    if isinstance(base, JSON):
        _check_json(table, column.name, value, where)
        return value
    if value is None:
        if not column.nullable:
            raise ImportFormatError(f"{what} may not be null")
        return None
    if isinstance(kind, UTCDateTime):
        if not isinstance(value, str):
            raise ImportFormatError(f"{what} must be an ISO 8601 timestamp string, got {_show(value)}")
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError as exc:
            raise ImportFormatError(f"{what}: {exc}") from exc
    if isinstance(base, LargeBinary):
        try:
            return base64.b64decode(value, validate=True)
        except (TypeError, ValueError) as exc:
            raise ImportFormatError(f"{what}: bad base64") from exc
    if isinstance(base, Boolean):
        if not isinstance(value, bool):
            raise ImportFormatError(f"{what} must be true or false, got {_show(value)}")
    elif isinstance(base, Integer):
        if not _is_int(value) or not INT_MIN <= value <= INT_MAX:
            raise ImportFormatError(f"{what} must be an integer from {INT_MIN} to {INT_MAX}, got {_show(value)}")
    elif isinstance(base, Float):
        if not ((isinstance(value, float) and math.isfinite(value)) or (_is_int(value) and abs(value) < 2**1023)):
            raise ImportFormatError(
                f"{what} must be a number (a finite float: not NaN, not infinite), got {_show(value)}"
            )
    elif isinstance(base, String):  # Text is a String
        if not isinstance(value, str):
            raise ImportFormatError(f"{what} must be a string, got {_show(value)}")
        if base.length is not None and len(value) > base.length:
            raise ImportFormatError(f"{what} is {len(value)} characters long; at most {base.length} are accepted")
    return value


def _check_vector(row: dict[str, Any], where: str) -> None:
    dim, vector = row["dim"], row["vector"]
    if not 1 <= dim <= MAX_EMBEDDING_DIM:
        raise ImportFormatError(f"{where}: embeddings.dim must be from 1 to {MAX_EMBEDDING_DIM}, got {dim}")
    if len(vector) != 4 * dim:
        raise ImportFormatError(
            f"{where}: embeddings.vector holds {len(vector)} bytes; a vector of dim {dim} is {4 * dim} "
            "(float32, little-endian)"
        )
    if not np.isfinite(np.frombuffer(vector, dtype="<f4")).all():
        raise ImportFormatError(f"{where}: embeddings.vector holds NaN or infinite values")


# -- rows of older revisions -----------------------------------------------------------------------


@cache
def _migration(filename: str) -> Any:
    """A migration module, for the rules it applied (loaded by path: its name starts with a digit)."""
    path = MIGRATIONS_DIR / "versions" / filename
    spec = importlib.util.spec_from_file_location(f"memory_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _to_0002(table: str, row: dict[str, Any]) -> dict[str, Any]:
    if table == "lesson_sets" and isinstance(row.get("note"), str) and "status" not in row:
        status, made_by, note = _migration("0002_state_columns.py").read_note(row["note"])
        return {**row, "status": status, "made_by": made_by, "note": note}
    if table == "evaluations" and "kind" not in row:
        split = row.get("split")
        return {**row, "kind": split if split in ("gate", "lesson-utility") else "eval"}
    return row


def _to_0003(table: str, row: dict[str, Any]) -> dict[str, Any]:
    if table == "opcd_cycles" and "episode_ids" not in row:
        return {**row, "episode_ids": []}
    return row


def _to_0004(table: str, row: dict[str, Any]) -> dict[str, Any]:
    if table == "lessons" and "forgotten_at" not in row:
        return {**row, "forgotten_at": None}
    return row


def _to_0005(table: str, row: dict[str, Any]) -> dict[str, Any]:
    column = {"episodes": "adapter_fingerprint", "adapters": "fingerprint"}.get(table)
    if column is not None and column not in row:
        return {**row, column: None}
    return row


def _to_0006(table: str, row: dict[str, Any]) -> dict[str, Any]:
    if table == "lessons" and "scope" not in row:  # shown everywhere before scopes: so after them
        return {**row, "scope": ["*"]}
    return row


def _to_0007(table: str, row: dict[str, Any]) -> dict[str, Any]:
    if table == "lessons" and row.get("forgotten_at") is not None and row.get("status") != "retired":
        return {**row, "status": "retired"}
    return row


UPGRADES = (  # (from, the next step)
    ("0001", _to_0002),
    ("0002", _to_0003),
    ("0003", _to_0004),
    ("0004", _to_0005),
    ("0005", _to_0006),
    ("0006", _to_0007),
)
READABLE_REVISIONS = tuple(r for r, _ in UPGRADES) + ("0007",)


def upgrade_row(revision: str, table: str, row: dict[str, Any]) -> dict[str, Any]:
    """A row exported at `revision` (one of `READABLE_REVISIONS`), as the migrations since would have
    changed it."""
    start = READABLE_REVISIONS.index(revision)
    for _, step in UPGRADES[start:]:
        row = step(table, row)
    return row


# -- references between rows -----------------------------------------------------------------------


@dataclass
class _Ref:
    where: str
    what: str  # "episodes.lessons_in_context"
    owner_run: int | None | tuple[str, int]  # a run id, or (table, id) of a row whose run it is
    target: str
    ids: list[int]
    allow_missing: bool = False


@dataclass
class References:
    """The ids imported rows name, checked together at the end of an import (see module docstring)."""

    refs: list[_Ref] = field(default_factory=list)

    def note(self, table: str, row: dict[str, Any], where: str) -> None:
        """Remember what `row` (decoded, of `table`) names."""
        run = row.get("run_id")
        for (owner, column), (target, allow_missing) in JSON_REFERENCES.items():
            if owner == table and row.get(column):
                self.refs.append(_Ref(where, f"{table}.{column}", run, target, list(row[column]), allow_missing))
        for (owner, column), target in RUN_KEYS.items():
            if owner == table and row.get(column) is not None:
                self.refs.append(_Ref(where, f"{table}.{column}", run, target, [row[column]]))
        if table == "lesson_set_members":
            self.refs.append(
                _Ref(
                    where,
                    "lesson_set_members.lesson_id",
                    ("lesson_sets", row["lesson_set_id"]),
                    "lessons",
                    [row["lesson_id"]],
                )
            )
        if table == "embeddings":
            target = "episodes" if row["kind"] == "episode" else "lessons"
            self.refs.append(_Ref(where, "embeddings.item_id", None, target, [row["item_id"]]))

    def check(self, session: Session, tables: dict[str, Table], source: str) -> None:
        """Raise `ImportFormatError` for the first reference (in file order) that is missing or crosses runs."""
        wanted: dict[str, set[int]] = {}
        for ref in self.refs:
            wanted.setdefault(ref.target, set()).update(ref.ids)
            if isinstance(ref.owner_run, tuple):
                wanted.setdefault(ref.owner_run[0], set()).add(ref.owner_run[1])
        runs = {name: _runs_of(session, tables[name], ids) for name, ids in wanted.items()}
        newest_episode = int(session.scalar(select(func.max(tables["episodes"].c.id))) or 0)
        for ref in self.refs:
            owner = ref.owner_run
            if isinstance(owner, tuple):
                owner = runs[owner[0]].get(owner[1])
            for target_id in ref.ids:
                if target_id not in runs[ref.target]:
                    if ref.allow_missing and target_id < newest_episode:
                        continue  # a pruned episode: provenance outlives it
                    raise ImportFormatError(
                        f"{ref.where}: {ref.what} names {ref.target} id {target_id}, which is neither in the file "
                        "nor in the store"
                    )
                target_run = runs[ref.target][target_id]
                if owner is not None and target_run is not None and target_run != owner:
                    raise ImportFormatError(
                        f"{ref.where}: {ref.what} names {ref.target} id {target_id} of run {target_run}, from a row "
                        f"of run {owner}; a row may name rows of its own run or of none"
                    )


def _runs_of(session: Session, table: Table, ids: set[int]) -> dict[int, int | None]:
    """id -> run id (None: of no run) for the rows of `table` among `ids` that exist."""
    run = table.c.run_id if "run_id" in table.c else None
    found: dict[int, int | None] = {}
    ordered = sorted(ids)
    for start in range(0, len(ordered), LOOKUP_CHUNK):
        chunk = ordered[start : start + LOOKUP_CHUNK]
        columns = (table.c.id, run) if run is not None else (table.c.id,)
        for row in session.execute(select(*columns).where(table.c.id.in_(chunk))):
            found[row[0]] = row[1] if run is not None else None
    return found
