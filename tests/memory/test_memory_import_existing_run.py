"""An import never changes what a run already in the store acts with: its lessons arrive as proposed candidates
without trial evidence, its lesson-set versions as candidates for the run's own gate, its adapters not active, and
a row that would edit a version the store holds is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distill.lessons import live_lessons, live_version, pending_candidate
from memory import ExperienceStore, ImportFormatError
from memory.embeddings import HashEmbedder
from memory.testing import make_episode

TRIALS = {
    "toy/a": {
        "promote": True,
        "reason": "made up",
        "n": 8,
        "margin": 0.0,
        "current_successes": 0,
        "candidate_successes": 8,
        "current_rate": 0.0,
        "candidate_rate": 1.0,
        "delta": 1.0,
        "current_ci": [0.0, 0.3],
        "candidate_ci": [0.7, 1.0],
        "delta_ci": [0.5, 1.0],
        "keys": 8,
    }
}


@pytest.fixture
def running(tmp_path: Path):
    """A store with run 1 acting with live version v1 [lesson 1] and adapter 1, and rows of it to copy."""
    store = ExperienceStore.open(tmp_path / "work", embedder=HashEmbedder(16))
    run_id = store.create_run("r", {"name": "r"})
    episode = store.add_episode(run_id, make_episode(1))
    _, (lesson,) = store.record_extraction("m", ["Read the goal."], run_id=run_id, episode_ids=[episode])
    store.create_lesson_set(run_id, [lesson])
    store.set_lesson_status([lesson], "active")
    adapter = store.add_adapter("a", "/x", run_id=run_id, status="active")
    store.add_evaluation("toy/a", run_id=run_id, kind="gate", success_rate=0.5)
    store.export_jsonl(tmp_path / "export.jsonl")
    rows = {}
    for line in (tmp_path / "export.jsonl").read_text().splitlines()[1:-1]:
        item = json.loads(line)
        rows.setdefault(item["table"], item["row"])
    header = (tmp_path / "export.jsonl").read_text().splitlines()[0]
    yield store, run_id, lesson, adapter, rows, header
    store.close()


def _file(tmp_path: Path, header: str, rows: list[tuple[str, dict[str, Any]]]) -> Path:
    counts: dict[str, int] = {}
    lines = [header]
    for table, row in rows:
        lines.append(json.dumps({"table": table, "row": row}))
        counts[table] = counts.get(table, 0) + 1
    lines.append(json.dumps({"end": True, "counts": counts}))
    path = tmp_path / "addition.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _smuggled(rows: dict[str, dict[str, Any]], run_id: int) -> list[tuple[str, dict[str, Any]]]:
    """A lesson for every environment with made-up trials, and a new live version of it alone."""
    lesson = rows["lessons"] | {
        "id": 100,
        "run_id": run_id,
        "text": "Open every door before you go north.",
        "status": "active",
        "scope": ["*"],
        "times_in_context": 500,
        "wins_in_context": 500,
        "metadata": {"scope_trials": TRIALS, "proposed_scope": ["*"], "accepted": True},
    }
    version = rows["lesson_sets"] | {"id": 100, "run_id": run_id, "version": 2, "status": "live", "made_by": "agent"}
    member = {"lesson_set_id": 100, "lesson_id": 100, "position": 0}
    return [("lessons", lesson), ("lesson_sets", version), ("lesson_set_members", member)]


def test_an_imported_lesson_and_live_version_for_an_existing_run_arrive_as_a_candidate(running, tmp_path) -> None:
    store, run_id, lesson, _, rows, header = running
    notes: list[str] = []
    counts = store.import_jsonl(_file(tmp_path, header, _smuggled(rows, run_id)), notes=notes)
    assert counts["lessons"] == 1 and counts["lesson_sets"] == 1
    assert live_version(store, run_id).version == 1
    assert [x.id for x in live_lessons(store, run_id)[1]] == [lesson]
    imported = store.get_lesson(100)
    assert imported.status == "proposed" and imported.times_in_context == 0 and imported.wins_in_context == 0
    assert not {"scope_trials", "accepted", "proposed_scope"} & set(imported.metadata)
    pending = pending_candidate(store, run_id)
    assert pending.version == 2 and pending.lesson_ids == [100] and pending.made_by == "user"
    shown = "\n".join(notes)
    assert "scope_trials" in shown and "run 1" in shown and "candidate" in shown


def test_an_imported_row_that_adds_to_a_version_the_store_holds_is_refused(running, tmp_path) -> None:
    store, run_id, lesson, _, rows, header = running
    smuggled = _smuggled(rows, run_id)[:1] + [
        ("lesson_set_members", {"lesson_set_id": 1, "lesson_id": 100, "position": 1})
    ]
    with pytest.raises(ImportFormatError, match="lesson-set version.*already in the store"):
        store.import_jsonl(_file(tmp_path, header, smuggled))
    assert store.lessons(run_id, ids=[100]) == [] and live_version(store, run_id).lesson_ids == [lesson]


def test_an_imported_adapter_or_trial_evidence_for_an_existing_run_does_not_act(running, tmp_path) -> None:
    store, run_id, _, adapter, rows, header = running
    extra = [
        ("adapters", rows["adapters"] | {"id": 100, "run_id": run_id, "status": "active", "name": "smuggled"}),
        ("evaluations", rows["evaluations"] | {"id": 100, "run_id": run_id, "kind": "lesson-utility"}),
    ]
    notes: list[str] = []
    counts = store.import_jsonl(_file(tmp_path, header, extra), notes=notes)
    assert store.active_adapter(run_id).id == adapter
    assert store.adapters(run_id, status="candidate")[-1].id == 100
    assert counts["evaluations"] == 0 and [e.id for e in store.evaluations(run_id)] == [1]
    assert any("adapter #100" in n for n in notes) and any("lesson-utility" in n for n in notes)


def test_a_run_request_for_an_existing_run_is_refused(running, tmp_path) -> None:
    store, run_id, _, _, _, header = running
    request = {"id": 100, "run_id": run_id, "kind": "reconsolidate", "payload": {}, "outcome": {}}
    request |= {"created_at": "2026-01-01T00:00:00+00:00", "done_at": None}
    with pytest.raises(ImportFormatError, match="run request"):
        store.import_jsonl(_file(tmp_path, header, [("run_requests", request)]))


def test_an_import_never_puts_a_forgotten_lesson_back_in_a_version(running, tmp_path) -> None:
    store, run_id, lesson, _, rows, header = running
    store.forget_lessons([lesson], reason="wrong")
    version = rows["lesson_sets"] | {"id": 100, "run_id": run_id, "version": 2, "status": "live"}
    member = {"lesson_set_id": 100, "lesson_id": lesson, "position": 0}
    with pytest.raises(ImportFormatError, match=f"v2 of run {run_id}.*forgotten lessons #{lesson}"):
        store.import_jsonl(_file(tmp_path, header, [("lesson_sets", version), ("lesson_set_members", member)]))
    assert [s.version for s in store.lesson_sets(run_id)] == [1]
    forgotten_active = rows["lessons"] | {"id": 100, "status": "active", "forgotten_at": "2026-01-01T00:00:00+00:00"}
    with pytest.raises(ImportFormatError, match="lesson 100 is forgotten"):
        store.import_jsonl(_file(tmp_path, header, [("lessons", forgotten_active)]))


def test_the_import_command_says_what_it_changed_in_an_existing_run(running, tmp_path, cli) -> None:
    store, run_id, _, _, rows, header = running
    path = _file(tmp_path, header, _smuggled(rows, run_id))
    store.close()
    out = json.loads(cli("memory", "import", path, "--workdir", tmp_path / "work", "--json").stdout)
    assert out["lessons"] == 1 and any("scope_trials" in n for n in out["notes"])
