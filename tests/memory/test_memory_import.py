"""Importing someone's export: every malformed input is a line-numbered error and nothing is written; an
export written at an older schema revision imports as its database would have migrated."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, func, insert, select

from memory import ExperienceStore, ImportFormatError, migrate
from memory.embeddings import HashEmbedder
from memory.models import Base
from memory.testing import make_episode
from tests import TESTS

DATA = TESTS / "data"
OLD_EXPORT = DATA / "export_rev0001.jsonl"


def _populate(store: ExperienceStore) -> dict[str, int]:
    """Two runs, each with episodes, lessons, a lesson set, an adapter and vectors."""
    ids: dict[str, int] = {}
    for name in ("a", "b"):
        run = store.create_run(name, {"name": name})
        episode = store.add_episode(run, make_episode(2))
        _, lessons = store.record_extraction("m", [f"lesson of {name}"], run_id=run, episode_ids=[episode])
        store.create_lesson_set(run, lessons)
        adapter = store.add_adapter(f"adapter-{name}", "/x", run_id=run)
        store.add_episode(run, make_episode(1, lessons=lessons))
        ids.update(
            {f"run_{name}": run, f"episode_{name}": episode, f"lesson_{name}": lessons[0], f"adapter_{name}": adapter}
        )
    store.reindex()
    return ids


@pytest.fixture
def exported(tmp_path: Path) -> tuple[list[str], dict[str, int]]:
    with ExperienceStore.open(tmp_path / "src", embedder=HashEmbedder(16)) as source:
        ids = _populate(source)
        source.export_jsonl(tmp_path / "src.jsonl")
    return (tmp_path / "src.jsonl").read_text().splitlines(), ids


def _row_line(lines: list[str], table: str, **match: Any) -> int:
    """The 1-based number of the first line holding a row of `table` whose columns equal `match`."""
    for n, line in enumerate(lines, start=1):
        item = json.loads(line)
        if item.get("table") == table and all(item["row"].get(k) == v for k, v in match.items()):
            return n
    raise AssertionError(f"no {table} row {match}")


def _changed(lines: list[str], n: int, change: Callable[[dict[str, Any]], None]) -> str:
    item = json.loads(lines[n - 1])
    change(item["row"])
    out = list(lines)
    out[n - 1] = json.dumps(item)
    return "\n".join(out) + "\n"


def _set(**values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda row: row.update(values)


def _vector(row: dict[str, Any], data: bytes) -> None:
    row["vector"] = base64.b64encode(data).decode()


def _counts(store: ExperienceStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            name: conn.scalar(select(func.count()).select_from(table)) for name, table in Base.metadata.tables.items()
        }


# (table, row to pick, change, the message's words); ids are those of `_populate` ("run_b" etc.)
MALFORMED = [
    ("episodes", {}, lambda ids: _set(lessons_in_context="abc"), "must be a list of integer ids"),
    ("episodes", {}, lambda ids: _set(lessons_in_context=[True]), "must be a list of integer ids"),
    ("episodes", {}, lambda ids: _set(metadata=[1, 2]), "must be a JSON object"),
    ("runs", {}, lambda ids: _set(config="secret"), "must be a JSON object"),
    ("steps", {}, lambda ids: _set(admissible_actions=[1, 2]), "a list of strings, or null"),
    ("steps", {}, lambda ids: _set(info=None), "must be a JSON object"),
    ("episodes", {}, lambda ids: _set(seed=2**70), "must be an integer from -2147483648 to 2147483647"),
    ("steps", {}, lambda ids: _set(prompt_tokens=-(2**40)), "must be an integer from"),
    ("steps", {}, lambda ids: _set(reward=10**400), "must be a number"),
    ("steps", {}, lambda ids: _set(reward="1.0"), "must be a number"),
    ("steps", {}, lambda ids: _set(prompt=5), "must be a string"),
    ("episodes", {}, lambda ids: _set(env_id="x" * 201), "at most 200 are accepted"),
    ("episodes", {}, lambda ids: _set(won=1), "must be true or false"),
    ("episodes", {}, lambda ids: _set(started_at=1700000000), "ISO 8601"),
    ("embeddings", {}, lambda ids: lambda row: _vector(row, b"\0" * 12), "holds 12 bytes; a vector of dim 16 is 64"),
    ("embeddings", {}, lambda ids: lambda row: _vector(row, b"\xff" * 64), "NaN or infinite"),
    ("embeddings", {}, lambda ids: _set(dim=2**20), "embeddings.dim must be from 1 to"),
    (
        "embeddings",
        {"id": 2},
        lambda ids: lambda row: (row.update(dim=8), _vector(row, b"\0" * 32)),
        "whose vectors have dim 16",
    ),
    ("embeddings", {}, lambda ids: _set(item_id=99_999), "names episodes id 99999, which is neither"),
    (
        "episodes",
        {"run_id": "run_b"},
        lambda ids: _set(lessons_in_context=[ids["lesson_a"]]),
        "of run 1, from a row of run 2",
    ),
    ("episodes", {}, lambda ids: _set(lessons_in_context=[777]), "names lessons id 777, which is neither"),
    (
        "lessons",
        {"run_id": "run_b"},
        lambda ids: _set(source_episode_ids=[ids["episode_a"]]),
        "of run 1, from a row of run 2",
    ),
    ("lessons", {"run_id": "run_b"}, lambda ids: _set(source_episode_ids=[10**6]), "names episodes id 1000000"),
    ("lessons", {}, lambda ids: _set(scope="textworld/coin_collector"), "lessons.scope must be a list of 1-64"),
    ("lessons", {}, lambda ids: _set(scope=[]), "lessons.scope must be a list of 1-64"),
    ("lessons", {}, lambda ids: _set(scope=["x" * 201]), "lessons.scope must be a list of 1-64"),
    (
        "lesson_set_members",
        {"lesson_set_id": 2},
        lambda ids: _set(lesson_id=ids["lesson_a"]),
        "of run 1, from a row of run 2",
    ),
    (
        "episodes",
        {"run_id": "run_b"},
        lambda ids: _set(adapter_id=ids["adapter_a"]),
        "episodes.adapter_id names adapters id",
    ),
]


@pytest.mark.parametrize(
    ("table", "match", "change", "message"), MALFORMED, ids=[f"{i}-{t}" for i, (t, _, _, _) in enumerate(MALFORMED)]
)
def test_malformed_rows_are_named_and_nothing_is_written(
    exported: tuple[list[str], dict[str, int]],
    tmp_path: Path,
    table: str,
    match: dict[str, Any],
    change: Callable[[dict[str, int]], Callable[[dict[str, Any]], None]],
    message: str,
) -> None:
    lines, ids = exported
    match = {k: ids[v] if isinstance(v, str) else v for k, v in match.items()}
    n = _row_line(lines, table, **match)
    broken = _changed(lines, n, change(ids))
    with ExperienceStore.open(tmp_path / "dst", embedder=HashEmbedder(16)) as target:
        kept = 100  # a run already there (an id the file does not use)
        with target.engine.begin() as conn:
            conn.execute(
                insert(Base.metadata.tables["runs"]),
                [{"id": kept, "name": "kept", "config": {}, "state": {}, "phase": "PLAY", "status": "running"}],
            )
        before = _counts(target)
        with pytest.raises(ImportFormatError) as raised:
            target.import_jsonl(io.StringIO(broken))
        assert raised.value.args[0].startswith(f"<stream>:{n}: "), raised.value
        assert message in str(raised.value)
        assert _counts(target) == before and target.get_run(kept).name == "kept"


def test_a_reference_into_the_store_is_checked_too(exported: tuple[list[str], dict[str, int]], tmp_path: Path) -> None:
    """An imported row may not name a row already in the store that belongs to another run."""
    lines, _ = exported
    with ExperienceStore.open(tmp_path / "dst") as target:
        for _ in range(3):
            target.create_run("local", {})
        local_lesson = target.add_lesson("local", run_id=1)
        shifted = [
            line
            for line in lines
            if json.loads(line).get("table") in (None, "runs", "episodes", "steps") or json.loads(line).get("end")
        ]
        body = []
        for line in shifted:
            item = json.loads(line)
            if "row" in item:
                row = item["row"]
                for key in ("id", "run_id", "episode_id") if item["table"] != "runs" else ("id",):
                    if key in row:
                        row[key] += 10
                if item["table"] == "episodes":
                    row["lessons_in_context"] = [local_lesson]
                    row["adapter_id"] = None
            if item.get("end"):
                item["counts"] = {t: sum(1 for x in body if json.loads(x).get("table") == t) for t in item["counts"]}
            body.append(json.dumps(item))
        with pytest.raises(
            ImportFormatError, match=f"names lessons id {local_lesson} of run 1, from a row of run 1[12]"
        ):
            target.import_jsonl(io.StringIO("\n".join(body) + "\n"))


def test_unreadable_lines(exported: tuple[list[str], dict[str, int]], tmp_path: Path) -> None:
    lines, _ = exported
    with ExperienceStore.open(tmp_path / "dst") as target:
        cases = [
            (2, "[" * 100_000, "not valid JSON", 10**6),
            (2, '{"table": "runs", "row": {"id": ' + "9" * 5000 + "}}", "not valid JSON", 10**6),
            (3, "x" * 5000, "line longer than 4096 characters", 4096),
        ]
        for n, text, message, limit in cases:
            broken = list(lines)
            broken[n - 1] = text
            with pytest.raises(ImportFormatError, match=f"<stream>:{n}: .*{message}"):
                target.import_jsonl(io.StringIO("\n".join(broken) + "\n"), max_line_chars=limit)
        assert target.stats()["runs"] == 0


def test_import_from_a_text_stream(exported: tuple[list[str], dict[str, int]], tmp_path: Path) -> None:
    lines, _ = exported
    with ExperienceStore.open(tmp_path / "dst") as target:
        counts = target.import_jsonl(io.StringIO("\n".join(lines) + "\n"))
        assert counts["episodes"] == 4 and target.stats()["episodes"] == 4


# -- exports of older schema revisions -----------------------------------------------------------


def _database_at_0001(path: Path, export: Path) -> None:
    """A database at revision 0001 holding the export's rows, written with 0001's tables (reflected)."""
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        from alembic import command

        command.upgrade(migrate._config(conn), "0001")
        tables = MetaData()
        tables.reflect(conn)
        for line in export.read_text().splitlines()[1:-1]:
            item = json.loads(line)
            table = tables.tables[item["table"]]
            row = dict(item["row"])
            for column in table.columns:
                value = row.get(column.name)
                if value is not None and str(column.type) == "DATETIME":
                    row[column.name] = dt.datetime.fromisoformat(value).replace(tzinfo=None)
                elif value is not None and column.name == "vector":
                    row[column.name] = base64.b64decode(value)
            conn.execute(insert(table), [row])
    engine.dispose()


def _body(path_or_text: Path | str) -> list[str]:
    text = path_or_text.read_text() if isinstance(path_or_text, Path) else path_or_text
    return text.splitlines()[1:]


def test_an_export_at_revision_0001_imports_as_its_database_would_have_migrated(
    memory_url: str, tmp_path: Path
) -> None:
    """The 0001 export (written by the code of that revision) imported into a new store reads back exactly as
    the same rows in a 0001 database opened (so migrated) by this code: lesson-set states taken out of the
    notes, gate and utility evaluations by kind, prompts whole."""
    assert json.loads(OLD_EXPORT.read_text().splitlines()[0])["schema_revision"] == "0001"
    _database_at_0001(tmp_path / "old.db", OLD_EXPORT)
    with ExperienceStore.open(tmp_path / "old.db", index_dir=tmp_path / "i0") as migrated:
        expected = io.StringIO()
        migrated.export_jsonl(expected)
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "i1") as store:
        counts = store.import_jsonl(OLD_EXPORT)
        assert counts["steps"] == 8 and counts["lesson_sets"] == 3
        got = io.StringIO()
        store.export_jsonl(got)
        sets = store.lesson_sets(1)
        assert [(s.status, s.made_by, s.note) for s in sets] == [
            ("live", "agent", "first"),
            ("candidate", "user", "add 2"),
            ("live", "user", "pool 0: add 2"),
        ]
        assert sorted(e.kind for e in store.evaluations(1)) == ["eval", "gate", "lesson-utility"]
        old_steps = [json.loads(x)["row"] for x in OLD_EXPORT.read_text().splitlines() if '"table": "steps"' in x]
        for row in old_steps:
            assert store.episode(row["episode_id"]).steps[row["step_index"]].prompt == row["prompt"]
    assert _body(got.getvalue()) == _body(expected.getvalue())


def test_exports_of_unknown_revisions_are_refused(tmp_path: Path) -> None:
    lines = OLD_EXPORT.read_text().splitlines()
    for revision, message in (
        ("9999", "imports revisions 0001, 0002, 0003, 0004, 0005, 0006, 0007"),
        (None, "revision None"),
    ):
        header = json.loads(lines[0]) | {"schema_revision": revision}
        with ExperienceStore.open(tmp_path / str(revision)) as store, pytest.raises(ImportFormatError, match=message):
            store.import_jsonl(io.StringIO("\n".join([json.dumps(header), *lines[1:]]) + "\n"))
    assert migrate.head_revision() == "0007"
