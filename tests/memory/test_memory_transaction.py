"""`ExperienceStore.transaction()`: many calls, one transaction. Everything inside commits together or not at
all, reads inside see the writes so far, another connection sees nothing until the end, and a call that fails
inside rolls back only its own part (as it would alone)."""

from __future__ import annotations

import pytest

from memory import ExperienceStore, InvalidRecordError


def test_all_or_nothing(store, memory_url):
    run_id = store.create_run("t", {})
    with pytest.raises(RuntimeError, match="killed"), store.transaction():
        lesson = store.add_lesson("Take the coin.", run_id=run_id)
        store.update_run(run_id, phase="EXTRACT", state={"episodes": 4})
        assert store.get_lesson(lesson).text == "Take the coin.", "reads inside see the writes so far"
        raise RuntimeError("killed")
    assert store.lessons(run_id) == [] and store.get_run(run_id).phase == "PLAY"
    with store.transaction():
        store.add_lesson("Take the coin.", run_id=run_id)
        with ExperienceStore.open(memory_url, read_only=True) as other:
            assert other.lessons(run_id) == [], "nothing is visible elsewhere before the end"
        store.update_run(run_id, phase="EXTRACT")
    assert len(store.lessons(run_id)) == 1 and store.get_run(run_id).phase == "EXTRACT"


def test_a_failing_call_inside_rolls_back_its_own_part(store):
    run_id = store.create_run("t", {})
    with store.transaction():
        store.add_lesson("kept", run_id=run_id)
        with pytest.raises(InvalidRecordError):
            store.add_lesson("a lesson of a run that does not exist", run_id=run_id + 99)
        store.add_lesson("also kept", run_id=run_id)
    assert [x.text for x in store.lessons(run_id)] == ["kept", "also kept"]
