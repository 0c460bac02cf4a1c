"""Lesson curation: add / merge / update / delete, the exact token budget, pools, versions and restore."""

from __future__ import annotations

import random

import pytest

from distill.lessons import (
    ExtractionOutcome,
    LessonCurator,
    LessonExtractor,
    LessonsConfig,
    UnknownVersionError,
    diff_versions,
    extract_phase,
    lesson_provenance,
    live_lessons,
    live_version,
    pending_candidate,
    record_extraction,
    render_lessons,
    restates,
    restore_version,
)
from memory import ExperienceStore
from memory.embeddings import HashEmbedder
from memory.testing import make_episode


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def ctx(memory_url, tmp_path):
    """A run with six episodes, on SQLite and on PostgreSQL."""
    store = ExperienceStore.open(memory_url, index_dir=tmp_path / "index", embedder=HashEmbedder(dim=256))
    run_id = store.create_run("curate", {})
    episodes = [store.add_episode(run_id, make_episode(1, task_id=f"t{i}")) for i in range(6)]
    yield store, run_id, episodes
    store.close()


def propose(store, run_id, episode_id, *items, pool=0):
    outcome = ExtractionOutcome(
        episode_id=episode_id,
        env_id="toy/corridor",
        pool=pool,
        style="structured",
        extractor="test",
        prompt="p",
        raw="r",
        items=list(items),
    )
    return record_extraction(store, outcome, run_id=run_id).proposals


def curator_for(store, run_id, **kwargs):
    options = {"count_tokens": words, "budget_tokens": 500, "merge_threshold": 0.8}
    return LessonCurator(store, run_id, **(options | kwargs))


def test_near_duplicate_merges_and_keeps_both_provenances(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Always check the map before moving.", "Holes end the game."))
    first = cur.commit().version
    assert first.version == 1 and len(first.lesson_ids) == 2

    cur.begin()
    changes = cur.apply(propose(store, run_id, eps[1], "Always check the map before you move."))
    assert [c.op for c in changes] == ["merge"]
    second = cur.commit().version
    merged = store.get_lesson(second.lesson_ids[0])
    assert merged.text == "Always check the map before moving."  # old wording, old position
    assert merged.source_episode_ids == [eps[0], eps[1]]
    old_id = first.lesson_ids[0]
    assert merged.metadata["merged_from"][0] == old_id
    assert len(merged.metadata["extraction_ids"]) == 2
    assert second.lesson_ids[1] == first.lesson_ids[1]
    statuses = {x.id: x.status for x in store.lessons(run_id)}
    assert statuses[merged.id] == "active" and statuses[old_id] == "retired"
    assert statuses[merged.metadata["merged_from"][1]] == "retired"  # the proposal never went live
    diff = diff_versions(store, run_id, 1, 2)
    assert diff.merged == [(old_id, merged.id)] and [x.id for x in diff.kept] == [first.lesson_ids[1]]

    shown = lesson_provenance(store, merged.id)
    assert [e["id"] for e in shown["source_episodes"]] == [eps[0], eps[1]]
    assert shown["extraction"]["episode_ids"] == [eps[1]] and shown["versions"] == [2]
    assert [(p["id"], p["relation"]) for p in shown["predecessors"]] == [
        (old_id, "merged"),
        (merged.metadata["merged_from"][1], "merged"),
    ]
    assert live_lessons(store, run_id, pool=0)[1][0].id == merged.id


def test_identical_text_is_deduplicated_even_below_the_threshold(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id, merge_threshold=1.0, conflict_threshold=1.0)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Holes end the game."))
    changes = cur.apply(propose(store, run_id, eps[1], "holes END the game"))
    assert [c.op for c in changes] == ["merge"]
    assert [x.text for x in cur.working(0)] == ["Holes end the game."]


@pytest.mark.parametrize(
    ("text", "restated"),
    [
        ("Look never helps.", True),  # part of the second sentence: "helps" and "help" are one word
        ("When you see a coin, take coin.", True),
        ("Take coin. Go through the exit.", True),  # every sentence is part of one of the lesson's
        ("Go first.", False),  # "first" is not there
        ("Never go.", False),  # the lesson says go: the polarity differs
        ("Take the exit.", False),  # the words of one sentence must be in one sentence
        ("Take coin. Open the chest.", False),
        ("", False),
    ],
)
def test_a_text_restates_a_lesson_when_its_sentences_are_parts_of_the_lessons(text, restated) -> None:
    assert (
        restates(text, "Go through the exit. Look and inventory never help. When you see a coin, take coin.")
        is restated
    )


def test_an_item_that_restates_a_lesson_merges_into_it_even_below_the_threshold(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id, merge_threshold=1.0, conflict_threshold=1.0)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Look and inventory never help. When you see a coin, take coin."))
    assert [c.op for c in cur.apply(propose(store, run_id, eps[1], "Look never helps."))] == ["merge"]
    assert cur.duplicate_of("Take coin.", 0, ["toy/corridor"]) is not None
    assert [c.op for c in cur.apply(propose(store, run_id, eps[2], "Never take coin."))] == ["add"]
    assert [x.text for x in cur.working(0)] == [
        "Look and inventory never help. When you see a coin, take coin.",
        "Never take coin.",
    ]


def test_conflicting_item_replaces_the_old_one(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id, merge_threshold=0.9, conflict_threshold=0.75)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Move right when the goal is to the right.", "Holes end the game."))
    cur.commit()
    changes = cur.apply(propose(store, run_id, eps[1], "Do not move right when the goal is to the right."))
    assert [c.op for c in changes] == ["update"] and changes[0].reason.startswith("conflict")
    assert [x.text for x in cur.working(0)] == [
        "Holes end the game.",
        "Do not move right when the goal is to the right.",
    ]
    old_id = changes[0].target
    replacement = cur.working(0)[-1]
    assert replacement.metadata["replaces"] == old_id and replacement.source_episode_ids == [eps[1]]
    cur.commit()
    assert diff_versions(store, run_id, 1, 2).updated == [(old_id, replacement.id)]


def test_explicit_update_and_delete_instructions(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Go left at forks.", "Keys open chests."))
    left, keys = [x.id for x in cur.working(0)]
    changes = cur.apply(
        propose(store, run_id, eps[1], f"UPDATE #{left}: Go right at forks.", f"DELETE #{keys}", "DELETE #99999")
    )
    assert [c.op for c in changes] == ["update", "delete", "skip"]
    assert [x.text for x in cur.working(0)] == ["Go right at forks."]
    version = cur.commit().version
    assert store.get_lesson(version.lesson_ids[0]).metadata["target"] == left


VOCAB = ["map", "goal", "hole", "box", "wall", "key", "door", "north", "south", "east", "west", "push", "look"]


def random_item(rng: random.Random) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(rng.randint(3, 15))) + f" {rng.random():.6f}"


@pytest.mark.parametrize("budget", [0, 7, 40, 97])
def test_budget_is_never_exceeded_and_oldest_go_first(ctx, budget: int) -> None:
    store, run_id, eps = ctx

    def count(text: str) -> int:  # deliberately not additive over lines
        return (len(text.encode()) + 2) // 3

    cur = curator_for(
        store, run_id, count_tokens=count, budget_tokens=budget, merge_threshold=1.0, conflict_threshold=1.0
    )
    cur.begin()
    rng = random.Random(budget)
    added = []
    for i in range(25):
        text = random_item(rng)
        added.append(text)
        cur.apply(propose(store, run_id, eps[i % len(eps)], text))
        assert count(render_lessons(x.text for x in cur.working(0))) <= budget
    kept = [x.text for x in cur.working(0)]
    assert kept == added[len(added) - len(kept) :]  # without utilities, the oldest are dropped first
    if len(kept) < len(added):  # and the cut is tight: one more (older) item would not have fit
        assert count(render_lessons([added[-len(kept) - 1], *kept])) > budget
    result = cur.commit()
    if result.version is not None:
        assert result.version.token_count == result.tokens[0] <= budget


def test_lowest_utility_is_dropped_before_the_oldest(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id, budget_tokens=100)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "alpha alpha alpha alpha", "bravo bravo bravo bravo"))
    alpha, bravo = [x.id for x in cur.working(0)]
    cur.utilities = {alpha: 0.5, bravo: -0.3}
    cur.budget_tokens = words(render_lessons(["alpha alpha alpha alpha", "charlie charlie charlie charlie"]))
    changes = cur.apply(propose(store, run_id, eps[1], "charlie charlie charlie charlie"))
    assert [c.target for c in changes if c.op == "drop"] == [bravo]
    cur.budget_tokens = words(render_lessons(["alpha alpha alpha alpha"]))
    cur.apply(propose(store, run_id, eps[2], "delta delta delta delta"))
    # alpha is the oldest but has the best measured utility; the unmeasured ones (0.0) go first.
    assert [x.text for x in cur.working(0)] == ["alpha alpha alpha alpha"]


def test_pools_are_independent(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id, pools=2, budget_tokens=16, seed=5)
    assert [cur.pool_seed(p) for p in range(2)] == [5, 6]
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Holes end the game.", pool=0))
    changes = cur.apply(propose(store, run_id, eps[1], "Holes end the game.", pool=1))
    assert [c.op for c in changes] == ["add"]  # a duplicate in another pool is not merged
    cur.apply(propose(store, run_id, eps[2], "one two three four five six seven eight nine", pool=1))
    assert [x.text for x in cur.working(0)] == ["Holes end the game."]
    assert [x.text for x in cur.working(1)] == ["one two three four five six seven eight nine"]
    version = cur.commit().version
    assert [store.get_lesson(i).pool for i in version.lesson_ids] == [0, 1]
    assert [x.text for x in cur.live_lessons(1)] == ["one two three four five six seven eight nine"]


def test_restore_brings_back_an_exact_earlier_version(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id, merge_threshold=0.8)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Keys open chests.", "Holes end the game."))
    v1 = cur.commit().version
    cur.apply(propose(store, run_id, eps[1], "Always check the map before moving."))
    v2 = cur.commit().version
    keys = v1.lesson_ids[0]
    cur.apply(propose(store, run_id, eps[2], f"DELETE #{keys}", "Keys open chests and doors."))
    v3 = cur.commit().version
    assert (v1.version, v2.version, v3.version) == (1, 2, 3)

    restored = restore_version(store, run_id, 1)
    assert restored.version == 4 and restored.lesson_ids == v1.lesson_ids
    assert live_version(store, run_id).version == 4 and "restored v1" in restored.note
    assert [x.text for x in cur.live_lessons()] == ["Keys open chests.", "Holes end the game."]
    statuses = {x.id: x.status for x in store.lessons(run_id)}
    assert all(statuses[i] == "active" for i in v1.lesson_ids)
    assert all(statuses[i] == "retired" for i in set(v2.lesson_ids + v3.lesson_ids) - set(v1.lesson_ids))
    assert [x.text for x in diff_versions(store, run_id, 1, 2).added] == ["Always check the map before moving."]
    with pytest.raises(UnknownVersionError, match="known: 1, 2, 3, 4"):
        restore_version(store, run_id, 9)


def test_candidate_promote_and_reject(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Keys open chests."))
    live = cur.commit().version
    cur.apply(propose(store, run_id, eps[1], "Holes end the game."))
    candidate = cur.commit(candidate=True).version
    assert live_version(store, run_id).version == live.version
    assert pending_candidate(store, run_id).version == candidate.version
    new_id = candidate.lesson_ids[-1]
    assert store.get_lesson(new_id).status == "proposed"
    assert [x.text for x in cur.live_lessons()] == ["Keys open chests."]

    kept = cur.reject(candidate.version, note="gate: -0.20")
    assert kept.lesson_ids == live.lesson_ids and pending_candidate(store, run_id) is None
    assert store.get_lesson(new_id).status == "retired"

    cur.begin()
    cur.apply(propose(store, run_id, eps[2], "Doors need keys."))
    candidate = cur.commit(candidate=True).version
    promoted = cur.promote(candidate.version, note="gate: +0.10")
    assert promoted.lesson_ids == candidate.lesson_ids and "promoted candidate" in promoted.note
    assert [x.text for x in cur.live_lessons()] == ["Keys open chests.", "Doors need keys."]
    assert store.get_lesson(candidate.lesson_ids[-1]).status == "active"


def test_no_change_makes_no_version(ctx) -> None:
    store, run_id, eps = ctx
    cur = curator_for(store, run_id)
    cur.begin()
    cur.apply(propose(store, run_id, eps[0], "Keys open chests."))
    cur.commit()
    cur.apply(propose(store, run_id, eps[1], "keys open chests"))  # merges into a new row...
    assert cur.commit().version is not None  # ...which is a change of provenance, so a version
    result = cur.commit()
    assert result.version is None and len(store.lesson_sets(run_id)) == 2


def test_extract_phase_runs_pools_in_their_own_order(ctx) -> None:
    store, run_id, eps = ctx
    calls = []

    def complete(chats):
        calls.append(chats)
        out = []
        for chat in chats:
            task = chat[0]["content"].split("Task: ")[1].split("\n")[0]
            out.append(f"- EXPERIENCE ITEM: Remember lesson number {len(calls)} from {task}.")
        return out

    settings = LessonsConfig(pools=2, budget_tokens=40, merge_threshold=0.99, conflict_threshold=0.99)
    cur = LessonCurator.from_settings(store, run_id, settings, count_tokens=words)
    extractor = LessonExtractor.from_settings(complete, settings)
    result = extract_phase(store, run_id, eps[:4], extractor, cur, candidate=True)
    assert [len(c) for c in calls] == [2, 2, 2, 2]  # one batched call per step, one chat per pool
    orders = [[o.episode_id for o in result.outcomes if o.pool == p] for p in range(2)]
    assert sorted(orders[0]) == sorted(orders[1]) == sorted(eps[:4]) and orders[0] != orders[1]
    # later prompts show the lessons curated so far in the pool
    assert "Remember lesson number 1" in calls[1][0][0]["content"]
    version = result.curation.version
    assert version is not None and pending_candidate(store, run_id).version == version.version
    assert all(t <= 40 for t in result.curation.tokens.values())
    lesson = store.get_lesson(version.lesson_ids[0])
    assert lesson.extraction_id is not None and len(lesson.source_episode_ids) == 1


def test_diff_follows_merges_through_lessons_no_version_held(ctx):
    """A and B in v1; one round merges A into C and then C and B into D; v2 holds D. The diff links A and B to
    D (merged), instead of showing them as removed and D as unrelated."""
    from distill.lessons.versions import create_version

    store, run_id, _ = ctx
    a = store.add_lesson("Take the coin first.", run_id=run_id)
    b = store.add_lesson("Look before moving.", run_id=run_id)
    create_version(store, run_id, [a, b])
    c = store.add_lesson("Take the coin first, always.", run_id=run_id, metadata={"merged_from": [a]})
    d = store.add_lesson("Look, then take the coin.", run_id=run_id, metadata={"merged_from": [c, b]})
    create_version(store, run_id, [d])
    diff = diff_versions(store, run_id, 1, 2)
    assert sorted(diff.merged) == [(a, d), (b, d)] and not diff.updated
    assert [x.id for x in diff.added] == [d] and sorted(x.id for x in diff.removed) == [a, b]
