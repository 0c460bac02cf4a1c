"""The validation gate and per-lesson utility, with a scripted policy for which lessons help or hurt."""

from __future__ import annotations

import random

import pytest

from distill.lessons import (
    GateInputError,
    LessonCurator,
    decide_gate,
    lesson_utilities,
    load_utilities,
    measure_utilities,
    store_gate_decision,
    store_utilities,
)
from distill.lessons.curate import render_lessons
from memory import EVALUATION_GATE, EVALUATION_LESSON_UTILITY, LESSON_SET_CANDIDATE, LESSON_SET_LIVE, ExperienceStore
from memory.embeddings import HashEmbedder
from memory.intervals import wilson_interval
from memory.testing import make_episode

HELPS = "Avoid tiles marked H; they end the game."
HURTS = "Always move left first, whatever the map shows."


def scripted_policy(lessons: list[str], seed: int) -> bool:
    """Wins a seed-determined share of episodes: 50% alone, 80% with HELPS, 20% once HURTS is in context."""
    luck = random.Random(seed).random()
    if HURTS in lessons:
        return luck < 0.2
    return luck < (0.8 if HELPS in lessons else 0.5)


SEEDS = list(range(1000, 1060))


def outcomes(lessons: list[str]) -> dict[int, bool]:
    return {seed: scripted_policy(lessons, seed) for seed in SEEDS}


def test_gate_blocks_a_worse_set_on_the_same_seeds() -> None:
    decision = decide_gate(outcomes([HELPS]), outcomes([HELPS, HURTS]), margin=0.05)
    assert not decision.promote and decision.reason.startswith("blocked")
    assert decision.n == len(SEEDS)
    assert decision.delta == pytest.approx(decision.candidate_rate - decision.current_rate)
    assert decision.delta < -0.05
    lo, hi = decision.delta_ci
    assert lo <= decision.delta <= hi < 0  # clearly worse here
    assert decision.current_ci[0] <= decision.current_rate <= decision.current_ci[1]


def test_gate_promotes_a_better_or_equal_set() -> None:
    better = decide_gate(outcomes([]), outcomes([HELPS]))
    assert better.promote and better.delta > 0
    same = decide_gate(outcomes([HELPS]), outcomes([HELPS]))
    assert same.promote and same.delta == 0


def test_margin_tolerates_small_drops_only() -> None:
    current = [True] * 10 + [False] * 10
    slightly_worse = [True] * 9 + [False] * 11  # -0.05
    assert decide_gate(current, slightly_worse, margin=0.05).promote
    assert not decide_gate(current, slightly_worse, margin=0.0).promote


def test_gate_refuses_outcomes_on_different_seeds() -> None:
    with pytest.raises(GateInputError, match="same seeds"):
        decide_gate({1: True, 2: False}, {1: True, 3: True})
    with pytest.raises(GateInputError, match="same seeds"):
        decide_gate([True, False], [True])
    with pytest.raises(GateInputError, match="at least one"):
        decide_gate({}, {})
    with pytest.raises(GateInputError, match=r"\[0, 1\]"):
        decide_gate([2.0], [1.0])


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.fixture
def store(tmp_path):
    opened = ExperienceStore.open(tmp_path / "work", embedder=HashEmbedder(dim=64))
    yield opened
    opened.close()


def test_gate_decision_is_stored_with_its_numbers(store) -> None:
    run_id = store.create_run("gate", {})
    decision = decide_gate(outcomes([HELPS]), outcomes([HELPS, HURTS]))
    eval_id = store_gate_decision(
        store, decision, run_id=run_id, env_id="toy/corridor", current_version=3, candidate_version=4
    )
    row = store.get_evaluation(eval_id)
    assert row.kind == EVALUATION_GATE and row.lesson_set_version == 4 and row.num_episodes == len(SEEDS)
    assert store.evaluations(run_id, kind=EVALUATION_LESSON_UTILITY) == []
    assert row.metrics["promote"] is False and row.metrics["current_version"] == 3
    assert row.metrics["delta"] == pytest.approx(decision.delta)
    assert row.metrics["delta_ci"] == list(decision.delta_ci)


def test_utilities_from_logged_episodes_drive_what_is_dropped(store) -> None:
    run_id = store.create_run("utility", {})
    helps = store.add_lesson(HELPS, run_id=run_id)
    hurts = store.add_lesson(HURTS, run_id=run_id)
    texts = {helps: HELPS, hurts: HURTS}
    rng = random.Random(0)
    for seed in range(200):
        in_context = [i for i in (helps, hurts) if rng.random() < 0.5]
        won = scripted_policy([texts[i] for i in in_context], seed)
        record = make_episode(1, outcome="won" if won else "lost", lessons=in_context, seed=seed)
        store.add_episode(run_id, record)
    measured = measure_utilities(store, run_id)
    assert measured[helps].utility > 0.1 and measured[hurts].utility < -0.2
    assert measured[helps].n_with + measured[helps].n_without == 200
    store_utilities(store, run_id, measured)
    loaded = load_utilities(store, run_id)
    assert loaded[helps] == pytest.approx(measured[helps].utility)

    curator = LessonCurator(store, run_id, count_tokens=lambda s: len(s.split()), budget_tokens=1000, utilities=loaded)
    store.create_lesson_set(run_id, [hurts, helps], note="both")
    curator.begin()
    curator.budget_tokens = len(render_lessons([HELPS]).split())
    curator.enforce_budget(0)
    assert [x.text for x in curator.working(0)] == [HELPS]  # the harmful one goes, though it is newer


def test_utility_needs_enough_episodes_and_counts_merged_predecessors(store) -> None:
    run_id = store.create_run("u", {})
    old = store.add_lesson("Keys open chests.", run_id=run_id)
    merged = store.add_lesson("Keys open chests.", run_id=run_id, metadata={"merged_from": [old]})
    again = store.add_lesson("Keys open chests.", run_id=run_id, metadata={"merged_from": [merged]})
    for seed, (ctx, won) in enumerate(
        [([old], True), ([old], True), ([merged], True), ([], False), ([], False), ([], True), ([again], False)]
    ):
        store.add_episode(run_id, make_episode(1, outcome="won" if won else "lost", lessons=ctx, seed=seed))
    episodes = store.episodes(run_id)
    lessons = store.lessons(run_id)
    result = lesson_utilities(episodes, lessons, min_episodes=3)
    assert result[old].utility is None  # only 2 episodes with it
    assert result[merged].n_with == 3 and result[merged].utility == pytest.approx(1.0 - 1 / 4)
    assert result[again].n_with == 4 and result[again].wins_with == 3  # merges count transitively


def test_extract_gate_and_promote_or_block_end_to_end(store) -> None:
    """A harmful extracted lesson becomes a candidate, loses on the same seeds, and never goes live."""
    from distill.lessons import LessonExtractor, extract_phase, live_lessons, pending_candidate

    run_id = store.create_run("flow", {})
    episode_ids = [store.add_episode(run_id, make_episode(2, task_id=f"t{i}")) for i in range(2)]
    answers = iter([f"- EXPERIENCE ITEM: {HELPS}", f"- EXPERIENCE ITEM: {HURTS}"])
    extractor = LessonExtractor(lambda chats: [next(answers) for _ in chats])
    curator = LessonCurator(store, run_id, count_tokens=lambda s: len(s.split()), budget_tokens=200)

    def gate_round(episode_id: int) -> bool:
        result = extract_phase(store, run_id, [episode_id], extractor, curator, candidate=True)
        candidate = result.curation.version
        live, current = live_lessons(store, run_id)
        texts_now = [x.text for x in current]
        texts_new = [store.get_lesson(i).text for i in candidate.lesson_ids]
        decision = decide_gate(outcomes(texts_now), outcomes(texts_new), margin=0.05)
        store_gate_decision(
            store,
            decision,
            run_id=run_id,
            env_id="toy/corridor",
            current_version=live.version if live else None,
            candidate_version=candidate.version,
        )
        if decision.promote:
            curator.promote(candidate.version, note=decision.reason)
        else:
            curator.reject(candidate.version, note=decision.reason)
        return decision.promote

    assert gate_round(episode_ids[0]) is True
    assert [x.text for x in live_lessons(store, run_id)[1]] == [HELPS]
    assert gate_round(episode_ids[1]) is False
    assert [x.text for x in live_lessons(store, run_id)[1]] == [HELPS]
    assert pending_candidate(store, run_id) is None
    hurts = [x for x in store.lessons(run_id) if x.text == HURTS]
    assert [x.status for x in hurts] == ["retired"]
    gates = store.evaluations(run_id, kind=EVALUATION_GATE)
    assert [e.metrics["promote"] for e in gates] == [True, False]
    sets = store.lesson_sets(run_id)
    assert [s.status for s in sets] == [LESSON_SET_CANDIDATE, LESSON_SET_LIVE] * 2
    assert sets[-1].note.startswith("kept v2; blocked candidate v3; blocked: candidate")


def test_mcnemar_exact_p_values():
    from distill.lessons.gate import mcnemar_p

    assert mcnemar_p([False] * 10, [True] * 10) == pytest.approx(2 / 1024)
    assert mcnemar_p([True] * 10, [False] * 10) == pytest.approx(2 / 1024)  # two-sided
    assert mcnemar_p([True, False] * 5, [True, False] * 5) == 1.0  # no discordant pair
    # 3 up, 1 down: 2 * P(X <= 1 | n=4) = 2 * 5/16
    assert mcnemar_p([False, False, False, True, True], [True, True, True, False, True]) == pytest.approx(10 / 16)
