"""JSONL export/import: exact round trip, line-numbered errors, nothing half-imported."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from memory import ExperienceStore, ImportConflictError, ImportFormatError
from memory.embeddings import HashEmbedder
from memory.testing import make_episode


def _populate(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {"model": "tiny", "nested": {"x": [1, 2.5e-7]}})
    store.update_run(run_id, phase="EXTRACT", state={"episodes": 2})
    ep1 = store.add_episode(run_id, make_episode(3))
    store.add_episode(run_id, make_episode(2, outcome="error", seed=None, goal=None))
    _, lessons = store.record_extraction("m", ["one", "two"], run_id=run_id, episode_ids=[ep1])
    store.create_lesson_set(run_id, lessons, token_count=9)
    adapter = store.add_adapter("a", "/x", run_id=run_id, metadata={"rank": 8})
    cycle = store.start_cycle(run_id, {"lr": 3e-6}, base_adapter_id=None)
    store.update_cycle(cycle, adapter_id=adapter, curves={"loss": [0.1, 0.05]})
    store.promote_cycle(cycle, lessons[:1])
    store.add_evaluation("toy/corridor", run_id=run_id, adapter_id=adapter, success_rate=0.5)
    store.add_episode(run_id, make_episode(1, lessons=lessons))
    store.reindex()  # computes and stores the lesson and episode vectors


def _body(text: str) -> list[str]:
    return text.splitlines()[1:]  # everything but the header (which has a timestamp and source)


def test_round_trip_is_exact(store: ExperienceStore, tmp_path: Path) -> None:
    _populate(store)
    first = tmp_path / "a.jsonl"
    counts = store.export_jsonl(first)
    assert counts["episodes"] == 3 and counts["steps"] == 6 and counts["embeddings"] == 5
    with ExperienceStore.open(tmp_path / "copy", embedder=HashEmbedder(256)) as copy:
        assert copy.import_jsonl(first) == counts
        buffer = io.StringIO()
        copy.export_jsonl(buffer)
        assert _body(buffer.getvalue()) == _body(first.read_text())
        assert copy.episode(1) == store.episode(1)
        assert copy.search_lessons("two", k=1)[0].item.text == "two"
        # new rows continue after the imported ids
        assert copy.create_run("next", {}) == 2


def test_round_trip_into_postgres_and_back(tmp_path: Path, memory_url: str) -> None:
    with ExperienceStore.open(tmp_path / "src", embedder=HashEmbedder(256)) as source:
        _populate(source)
        source.export_jsonl(tmp_path / "a.jsonl")
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "i") as target:
        target.import_jsonl(tmp_path / "a.jsonl")
        target.export_jsonl(tmp_path / "b.jsonl")
        assert target.create_run("next", {}) == 2  # sequences moved past imported ids
    assert _body((tmp_path / "a.jsonl").read_text()) == _body((tmp_path / "b.jsonl").read_text())


def _exported(tmp_path: Path) -> list[str]:
    with ExperienceStore.open(tmp_path / "src", embedder=HashEmbedder(256)) as source:
        _populate(source)
        source.export_jsonl(tmp_path / "src.jsonl")
    return (tmp_path / "src.jsonl").read_text().splitlines()


def _break(lines: list[str], n: int, change) -> str:
    broken = list(lines)
    broken[n - 1] = change(broken[n - 1])
    return "\n".join(broken) + "\n"


def _set_row(line: str, key: str, value) -> str:
    item = json.loads(line)
    item["row"][key] = value
    return json.dumps(item)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda line: line[:-5], "not valid JSON"),
        (lambda line: json.dumps({"table": "nope", "row": {}}), 'expected {"table"'),
        (lambda line: _set_row(line, "num_steps", "three"), "episodes.num_steps must be an integer"),
        (lambda line: _set_row(line, "started_at", "yesterday"), "episodes.started_at"),
        (lambda line: _set_row(line, "extra", 1), r"unknown: \['extra'\]"),
        (lambda line: _set_row(line, "outcome", "draw"), "rejected by the database"),
    ],
)
def test_malformed_line_is_reported_and_nothing_imported(
    store: ExperienceStore, tmp_path: Path, change, message: str
) -> None:
    lines = _exported(tmp_path)
    n = next(i for i, line in enumerate(lines, 1) if '"table": "episodes"' in line) + 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_break(lines, n, change))
    with pytest.raises(ImportFormatError, match=message) as caught:
        store.import_jsonl(bad)
    assert f"bad.jsonl:{n}" in str(caught.value)
    assert store.stats() | {"url": None} == {
        "url": None,
        "runs": 0,
        "episodes": 0,
        "steps": 0,
        "lessons": 0,
        "outcomes": {},
    }


def test_truncated_file_and_bad_header(store: ExperienceStore, tmp_path: Path) -> None:
    lines = _exported(tmp_path)
    truncated = tmp_path / "t.jsonl"
    truncated.write_text("\n".join(lines[:-3]) + "\n")
    with pytest.raises(ImportFormatError, match=f"t.jsonl:{len(lines) - 2}: missing end marker"):
        store.import_jsonl(truncated)
    newer = tmp_path / "n.jsonl"
    newer.write_text(_break(lines, 1, lambda l: json.dumps({**json.loads(l), "version": 99})))
    with pytest.raises(ImportFormatError, match="n.jsonl:1: export format version 99 is newer"):
        store.import_jsonl(newer)
    assert store.stats()["runs"] == 0


def test_import_conflict_leaves_store_unchanged(store: ExperienceStore, tmp_path: Path) -> None:
    lines = _exported(tmp_path)
    store.create_run("mine", {})
    with pytest.raises(ImportConflictError, match="runs id 1 already exists"):
        store.import_jsonl(tmp_path / "src.jsonl")
    assert [r.name for r in store.runs()] == ["mine"] and len(lines) > 10
