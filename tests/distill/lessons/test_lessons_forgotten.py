"""A forgotten lesson never comes back: not by a rollback, a promotion of an old candidate, a curation round that
starts from an old version, a merge into it, or a proposal that restates it."""

from __future__ import annotations

import json

import pytest

from distill.lessons import ExtractionOutcome, LessonCurator, live_lessons, record_extraction, restore_version
from distill.lessons.forget import apply_forget, plan_forget
from distill.lessons.versions import create_version, live_version, promote_candidate
from memory import ExperienceStore
from memory.embeddings import HashEmbedder
from memory.testing import make_episode

KEPT = "Read the goal before you move."
FORGOTTEN = "Always take the coin before leaving the room."


def words(text: str) -> int:
    return len(text.split())


def forgotten_history(store: ExperienceStore) -> dict[str, int]:
    """v1 live [kept, forgotten], then `forgotten` forgotten (v2 live [kept])."""
    run_id = store.create_run("forgetting", {})
    episode = store.add_episode(run_id, make_episode(1))
    _, (kept, gone) = store.record_extraction("m", [KEPT, FORGOTTEN], run_id=run_id, episode_ids=[episode])
    create_version(store, run_id, [kept, gone], token_count=12)
    apply_forget(store, plan_forget(store, gone), count_tokens=words)
    return {"run": run_id, "episode": episode, "kept": kept, "gone": gone}


@pytest.fixture
def forgotten(memory_url, tmp_path):
    store = ExperienceStore.open(memory_url, index_dir=tmp_path / "index", embedder=HashEmbedder(dim=256))
    yield store, forgotten_history(store)
    store.close()


def test_rolling_back_to_a_version_that_held_a_forgotten_lesson_restores_it_without_that_lesson(forgotten) -> None:
    store, ids = forgotten
    info = restore_version(store, ids["run"], 1)
    assert info.lesson_ids == [ids["kept"]]
    assert f"without forgotten #{ids['gone']}" in info.note
    assert [x.id for x in live_lessons(store, ids["run"])[1]] == [ids["kept"]]
    lesson = store.get_lesson(ids["gone"])
    assert lesson.status == "retired" and lesson.forgotten_at is not None


def test_promoting_an_old_candidate_that_held_a_forgotten_lesson_leaves_it_out(memory_url, tmp_path) -> None:
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "index") as store:
        run_id = store.create_run("forgetting", {})
        _, (kept, gone) = store.record_extraction("m", [KEPT, FORGOTTEN], run_id=run_id)
        create_version(store, run_id, [kept])
        old = create_version(store, run_id, [kept, gone], candidate=True)
        apply_forget(store, plan_forget(store, gone), count_tokens=words)  # the candidate written again without it
        promoted = promote_candidate(store, run_id, old.version)
        assert promoted.lesson_ids == [kept] and f"without forgotten #{gone}" in promoted.note
        assert store.get_lesson(gone).status == "retired"


def test_the_store_refuses_a_version_or_status_that_would_make_a_forgotten_lesson_live(forgotten) -> None:
    from memory import InvalidRecordError

    store, ids = forgotten
    before = [s.version for s in store.lesson_sets(ids["run"])]
    with pytest.raises(InvalidRecordError, match=f"#{ids['gone']} was forgotten"):
        store.create_lesson_set(ids["run"], [ids["kept"], ids["gone"]])
    with pytest.raises(InvalidRecordError, match=f"#{ids['gone']} was forgotten"):
        store.create_lesson_set(ids["run"], [ids["gone"]], status="candidate")
    for status in ("active", "proposed", "consolidated"):
        with pytest.raises(InvalidRecordError, match=f"#{ids['gone']} was forgotten"):
            store.set_lesson_status([ids["gone"]], status)
    assert [s.version for s in store.lesson_sets(ids["run"])] == before
    assert store.get_lesson(ids["gone"]).status == "retired"


def _propose(store, run_id, episode_id, *items):
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


def test_a_curation_round_from_an_old_version_does_not_bring_a_forgotten_lesson_back(forgotten) -> None:
    store, ids = forgotten
    curator = LessonCurator(store, ids["run"], count_tokens=words, budget_tokens=500, merge_threshold=0.8)
    curator.begin(base_version=1)
    assert [x.id for x in curator.working(0)] == [ids["kept"]]
    changes = curator.apply(_propose(store, ids["run"], ids["episode"], "Take the coin before leaving the room."))
    assert [c.op for c in changes] == ["skip"] and f"forgotten #{ids['gone']}" in changes[0].reason
    changes = curator.apply(_propose(store, ids["run"], ids["episode"], FORGOTTEN.upper()))
    assert [c.op for c in changes] == ["skip"]
    result = curator.commit()
    live = live_version(store, ids["run"])
    assert result.version is None or FORGOTTEN not in [store.get_lesson(i).text for i in live.lesson_ids]
    assert all(x.text.lower() != FORGOTTEN.lower() for x in live_lessons(store, ids["run"])[1])


def test_the_rollback_command_says_which_forgotten_lessons_it_left_out(tmp_path, cli) -> None:
    with ExperienceStore.open(tmp_path) as store:
        ids = forgotten_history(store)
    out = json.loads(cli("lessons", "rollback", 1, "--workdir", tmp_path, "--json").stdout)
    assert out["left_out"] == [ids["gone"]] and out["new_version"] == 3
    text = cli("lessons", "rollback", 1, "--workdir", tmp_path).stdout
    assert f"without #{ids['gone']}, which was forgotten" in text
    with ExperienceStore.open(tmp_path) as store:
        assert live_version(store, ids["run"]).lesson_ids == [ids["kept"]]
