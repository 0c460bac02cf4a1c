"""Lessons, lesson sets, extractions, OPCD cycles, adapters and evaluations in the store."""

from __future__ import annotations

import pytest

from memory import ExperienceStore, InvalidRecordError, NotFoundError
from memory.testing import make_episode


def test_extraction_and_lessons_are_written_together(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    ep = store.add_episode(run_id, make_episode())
    ext_id, lesson_ids = store.record_extraction(
        "smollm2",
        ["Open doors before walking.", {"text": "Check the map.", "pool": 3}],
        run_id=run_id,
        episode_ids=[ep],
        prompt="P",
        response="R",
        env_id="toy/corridor",
    )
    ext = store.get_extraction(ext_id)
    assert (ext.extractor, ext.episode_ids, ext.prompt, ext.response) == ("smollm2", [ep], "P", "R")
    first, second = (store.get_lesson(i) for i in lesson_ids)
    assert (first.text, first.status, first.pool, first.extraction_id) == (
        "Open doors before walking.",
        "proposed",
        0,
        ext_id,
    )
    assert (second.pool, second.source_episode_ids, second.env_id) == (3, [ep], "toy/corridor")
    with pytest.raises(InvalidRecordError, match="unknown lesson status 'great'"):
        store.record_extraction("m", [{"text": "x", "status": "great"}], run_id=run_id)
    assert len(store.extractions(run_id)) == 1  # the failed call left no extraction behind
    assert store.count_lessons(run_id) == 2


def test_lesson_queries_status_and_usage(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    a = store.add_lesson("alpha", run_id=run_id, pool=0)
    b = store.add_lesson("beta", run_id=run_id, pool=1, status="active")
    store.add_lesson("gamma", run_id=None)
    assert [l.text for l in store.lessons(run_id)] == ["alpha", "beta"]
    assert [l.id for l in store.lessons(status="active")] == [b]
    assert [l.id for l in store.lessons(pool=1)] == [b]
    assert [l.id for l in store.lessons(ids=[a])] == [a]
    store.set_lesson_status([a, b], "active")
    assert store.count_lessons(run_id, status="active") == 2
    with pytest.raises(NotFoundError, match=r"no lessons with ids \[999\]"):
        store.set_lesson_status([a, 999], "retired")
    assert store.get_lesson(a).status == "active"  # nothing changed
    store.add_episode(run_id, make_episode(outcome="won", lessons=[a, b]))
    store.add_episode(run_id, make_episode(outcome="lost", lessons=[a]))
    assert (store.get_lesson(a).times_in_context, store.get_lesson(a).wins_in_context) == (2, 1)
    assert (store.get_lesson(b).times_in_context, store.get_lesson(b).wins_in_context) == (1, 1)


def test_lesson_set_versions(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    ids = [store.add_lesson(t, run_id=run_id) for t in "abc"]
    assert store.lesson_set(run_id) is None
    v1 = store.create_lesson_set(run_id, [ids[2], ids[0]], token_count=12, note="first")
    v2 = store.create_lesson_set(run_id, ids)
    assert (v1.version, v1.lesson_ids, v1.token_count) == (1, [ids[2], ids[0]], 12)
    assert store.lesson_set(run_id).version == 2 == v2.version
    assert store.lesson_set(run_id, 1).lesson_ids == [ids[2], ids[0]]
    assert [s.version for s in store.lesson_sets(run_id)] == [1, 2]
    other = store.create_run("other", {})
    assert store.create_lesson_set(other, []).version == 1  # versions count per run
    with pytest.raises(InvalidRecordError):
        store.create_lesson_set(run_id, [12345])  # unknown lesson: foreign key
    assert store.lesson_set(run_id).version == 2


def test_cycle_promotion_is_atomic(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    lessons = [store.add_lesson(t, run_id=run_id, status="active") for t in ("x", "y")]
    old = store.add_adapter("a0", "/tmp/a0", run_id=run_id, status="active")
    cycle = store.start_cycle(run_id, {"lr": 1e-6}, lesson_set_version=1, base_adapter_id=old)
    new = store.add_adapter("a1", "/tmp/a1", run_id=run_id, parent_id=old, base_model="tiny")
    store.update_cycle(
        cycle, adapter_id=new, metrics={"loss": 0.5}, curves={"loss": [1.0, 0.7, 0.5]}, status="succeeded", ended=True
    )
    got = store.get_cycle(cycle)
    assert (got.status, got.metrics, got.curves["loss"], got.adapter_id) == (
        "succeeded",
        {"loss": 0.5},
        [1.0, 0.7, 0.5],
        new,
    )
    assert got.ended_at is not None and got.config == {"lr": 1e-6}
    with pytest.raises(NotFoundError):
        store.promote_cycle(cycle, [lessons[0], 999])
    assert store.active_adapter(run_id).id == old  # the failed promotion changed nothing
    store.promote_cycle(cycle, [lessons[0]])
    assert store.get_cycle(cycle).status == "promoted"
    assert store.active_adapter(run_id).id == new
    assert store.get_adapter(old).status == "retired"
    assert store.get_adapter(new).parent_id == old
    consolidated = store.get_lesson(lessons[0])
    assert (consolidated.status, consolidated.consolidated_cycle_id) == ("consolidated", cycle)
    assert store.get_lesson(lessons[1]).status == "active"


def test_cycle_rollback_and_evaluations(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    cycle = store.start_cycle(run_id, {})
    adapter = store.add_adapter("a1", "/tmp/a1", run_id=run_id)
    store.update_cycle(cycle, adapter_id=adapter)
    store.rollback_cycle(cycle, error="eval regressed")
    got = store.get_cycle(cycle)
    assert (got.status, got.error) == ("rolled_back", "eval regressed")
    assert store.get_adapter(adapter).status == "rejected"
    assert store.active_adapter(run_id) is None
    ev = store.add_evaluation(
        "toy/corridor",
        run_id=run_id,
        adapter_id=adapter,
        cycle_id=cycle,
        num_episodes=8,
        success_rate=0.25,
        mean_return=1.5,
        metrics={"per_task": {"t1": 1}},
    )
    got_ev = store.get_evaluation(ev)
    assert (got_ev.success_rate, got_ev.num_episodes, got_ev.metrics) == (0.25, 8, {"per_task": {"t1": 1}})
    assert [e.id for e in store.evaluations(run_id, adapter_id=adapter)] == [ev]
    assert store.evaluations(cycle_id=cycle + 1) == []
    assert [c.id for c in store.cycles(run_id, status="rolled_back")] == [cycle]
    with pytest.raises(InvalidRecordError, match="unknown cycle status"):
        store.update_cycle(cycle, status="exploded")
    with pytest.raises(InvalidRecordError, match="unknown adapter status"):
        store.set_adapter_status(adapter, "shiny")
