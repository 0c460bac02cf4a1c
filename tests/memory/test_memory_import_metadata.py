"""`memory import` checks a lesson's metadata against the keys the runtime writes: ids are ids,
counts counts, rates in [0, 1], texts bounded strings, and a key the runtime does not write is refused. A bad value
names the line, the lesson, the field, what was given and what is accepted, and nothing is written; every kind of
lesson the runtime writes still goes round the trip."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from agent_runtime.config import config_from_dict
from agent_runtime.run.loop import AgentLoop
from distill.lessons import LessonCurator, decide_gate
from distill.lessons.extractor import ExtractionOutcome, record_extraction
from distill.lessons.induce import KINDS
from memory import ExperienceStore, ImportFormatError
from memory.embeddings import HashEmbedder
from memory.lesson_metadata import EVIDENCE_KINDS, LESSON_METADATA, lesson_metadata_problem
from memory.models import Base
from memory.testing import make_episode


def _config() -> Any:
    return config_from_dict(
        {
            "name": "metadata",
            "envs": [{"id": "tests.distill.lessons.test_lessons_induce:CoinRoom"}],
            "model": {"name": "scripted", "backend": "scripted", "options": {"follow_lessons": True}},
            "runtime": {"slots": 4, "episodes": 16},
            "lessons": {
                "enabled": True,
                "extract_every": 16,
                "method": "evidence",
                "gate_episodes": 8,
                "gate_split": "train",
                "embedder": "hash",
                "seed": ["Read the goal before the first move."],
            },
        }
    )


def _propose(store: ExperienceStore, run_id: int, episode_id: int, *items: str) -> list:
    outcome = ExtractionOutcome(
        episode_id=episode_id,
        env_id="toy/corridor",
        pool=0,
        style="structured",
        extractor="test",
        prompt="p",
        raw="r",
        items=list(items),
    )
    return record_extraction(store, outcome, run_id=run_id).proposals


def _every_kind_of_lesson(workdir: Path) -> None:
    """A store holding every lesson metadata the runtime writes, each through the code that writes it: a
    person's seed lesson, induced lessons with evidence and trial (a run of play and EXTRACT), merges, an
    UPDATE, a conflict's replacement, a narrowed scope with its trials, a forgotten lesson."""
    loop = AgentLoop(_config(), workdir, progress=False)
    run_id = loop.run().run_id
    loop.close()
    with ExperienceStore.open(workdir, embedder=HashEmbedder(256)) as store:
        episode = store.add_episode(run_id, make_episode(1, task_id="t"))
        curator = LessonCurator(
            store, run_id, count_tokens=lambda s: len(s.split()), budget_tokens=500, conflict_threshold=0.75
        )
        curator.begin()
        curator.apply(_propose(store, run_id, episode, "Go left at forks.", "Move right when the goal is right."))
        [left] = [x.id for x in curator.working(0) if x.text == "Go left at forks."]
        curator.apply(_propose(store, run_id, episode, "Go left at forks.", f"UPDATE #{left}: Go right at forks."))
        curator.apply(_propose(store, run_id, episode, "Do not move right when the goal is right."))
        curator.commit()
        user = next(x for x in store.lessons(run_id) if x.metadata.get("source") == "user")
        decision = decide_gate([False, True], [True, True])
        stored = decision.to_dict() | {"keys": len(decision.keys)}
        trials = {
            "tests.distill.lessons.test_lessons_induce:CoinRoom": stored | {"together": stored | {"with": [left]}}
        }
        store.set_lesson_scope([user.id], ["tests.distill.lessons.test_lessons_induce:CoinRoom"], trials)
        store.forget_lessons([left], reason=f"forgot #{left}")
        store.reindex()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    workdir = tmp_path_factory.mktemp("every-kind")
    _every_kind_of_lesson(workdir)
    with ExperienceStore.open(workdir) as store:
        store.export_jsonl(workdir / "export.jsonl")
    return (workdir / "export.jsonl").read_text().splitlines()


def _lessons(lines: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) of every lesson of the export."""
    out = []
    for n, line in enumerate(lines, start=1):
        item = json.loads(line)
        if item.get("table") == "lessons":
            out.append((n, item["row"]))
    return out


def test_every_kind_of_lesson_goes_round_the_trip(exported: list[str], tmp_path: Path) -> None:
    written = {key for _, row in _lessons(exported) for key in row["metadata"]}
    assert written == set(LESSON_METADATA), "the store holds every key the schema knows, and no other"
    with ExperienceStore.open(tmp_path / "copy") as copy:
        copy.import_jsonl(io.StringIO("\n".join(exported) + "\n"))
        again = io.StringIO()
        copy.export_jsonl(again)
    assert again.getvalue().splitlines()[1:] == exported[1:]


def test_a_combinations_trial_names_the_other_lessons_by_id() -> None:
    decision = decide_gate([False, True], [True, True])
    stored = decision.to_dict() | {"keys": len(decision.keys)}
    good = {"scope_trials": {"env/x": stored | {"together": stored | {"with": [3]}}}}
    assert (
        lesson_metadata_problem(good) is None and lesson_metadata_problem({"scope_trials": {"env/x": stored}}) is None
    )
    bad = {"scope_trials": {"env/x": stored | {"together": stored | {"with": ["<b>3</b>"]}}}}
    assert "metadata.scope_trials.env/x.together.with[0] must be an id" in lesson_metadata_problem(bad)


def test_the_evidence_kinds_are_the_ones_induction_writes() -> None:
    assert EVIDENCE_KINDS == KINDS


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set `path` ("trial.n", "evidence.won_episode_ids") to `value` in a lesson's metadata."""
    *parents, last = path.split(".")

    def change(metadata: dict[str, Any]) -> None:
        target = metadata
        for part in parents:
            target = target[part]
        target[last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    parent, last = path.rsplit(".", 1)
    return lambda metadata: metadata[parent].pop(last)


BAD = [
    # markup where an id or a count belongs
    (
        "evidence",
        _set("evidence.won_episode_ids", ["<script>alert(1)</script>"]),
        "evidence.won_episode_ids[0]",
        "an id",
    ),
    ("trial", _set("trial.n", "<b>24</b>"), "trial.n", "a count"),
    # ids, counts, rates, numbers, booleans, pairs
    ("evidence", _set("evidence.lost_episode_ids", [0]), "evidence.lost_episode_ids[0]", "an id"),
    ("evidence", _set("evidence.chose_lost", -1), "evidence.chose_lost", "a count"),
    ("evidence", _set("evidence.avail_won", 2.5), "evidence.avail_won", "a count"),
    ("evidence", _set("evidence.p_won", 1.5), "evidence.p_won", "a rate"),
    ("evidence", _set("evidence.z", "4.0"), "evidence.z", "a finite number"),
    ("evidence", _set("evidence.kind", "<i>prefer</i>"), "evidence.kind", "one of"),
    ("trial", _set("trial.current_rate", True), "trial.current_rate", "a rate"),
    ("trial", _set("trial.delta", -2), "trial.delta", "from -1 to 1"),
    ("trial", _set("trial.promote", "yes"), "trial.promote", "true or false"),
    ("trial", _set("trial.current_ci", [0.2]), "trial.current_ci", "a pair"),
    ("trial", _set("trial.candidate_ci", [0.9, 0.1]), "trial.candidate_ci", "a pair"),
    ("accepted", _set("accepted", 1), "accepted", "true or false"),
    ("merged_from", _set("merged_from", ["1"]), "merged_from[0]", "an id"),
    ("target", _set("target", True), "target", "an id"),
    ("scope_trials", _set("scope_trials", {"env/x": "<b>won</b>"}), "scope_trials.env/x", "an object"),
    ("proposed_scope", _set("proposed_scope", "*"), "proposed_scope", "a list"),
    # texts: strings, bounded
    ("evidence", _set("evidence.summary", "x" * 10_001), "evidence.summary", "at most 10000 characters"),
    ("source", _set("source", 7), "source", "a string"),
    ("forgotten", _set("forgotten", ["<script>"]), "forgotten", "a string"),
    ("merged_texts", _set("merged_texts", [None]), "merged_texts[0]", "a string"),
    # shapes: an object where one is expected, nothing missing, no key the runtime does not write
    ("evidence", _set("evidence", "<i>won 7 of 7</i>"), "evidence", "an object"),
    ("evidence", _drop("evidence.summary"), "evidence", "missing"),
    ("trial", _set("trial.html", "<script>"), "trial", "unknown key 'html'"),
    ("source", _set("note", "<script>alert(1)</script>"), "metadata", "unknown key 'note'"),
]


@pytest.mark.parametrize(
    ("holding", "change", "field", "accepted"), BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)]
)
def test_a_bad_lesson_metadata_value_is_named_and_nothing_is_written(
    exported: list[str], tmp_path: Path, holding: str, change: Callable, field: str, accepted: str
) -> None:
    lines = list(exported)
    [(n, row)] = [(n, row) for n, row in _lessons(lines) if holding in row["metadata"]][:1]
    change(row["metadata"])
    lines[n - 1] = json.dumps({"table": "lessons", "row": row})
    with ExperienceStore.open(tmp_path / "target") as target:
        with pytest.raises(ImportFormatError) as raised:
            target.import_jsonl(io.StringIO("\n".join(lines) + "\n"))
        message = str(raised.value)
        assert f"<stream>:{n}: lesson {row['id']}: metadata" in message, message
        assert f"metadata.{field}" in message or field == "metadata", message
        assert accepted in message and "got " in message and "nothing was imported" in message, message
        with target.engine.connect() as conn:
            assert all(conn.scalar(select(func.count()).select_from(t)) == 0 for t in Base.metadata.tables.values())


def test_the_schema_check_alone() -> None:
    assert lesson_metadata_problem({}) is None
    assert lesson_metadata_problem({"source": "user", "proposed_scope": ["*"]}) is None
    assert "must be an object" in (lesson_metadata_problem([]) or "")
    problem = lesson_metadata_problem({"replaces": 2**31})
    assert problem == "metadata.replaces must be an id (an integer from 1 to 2147483647), got 2147483648"
