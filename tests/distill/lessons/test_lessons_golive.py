"""Where a candidate's new lessons go live (`distill.lessons.golive`), on scripted games: per environment, a lesson
proposed everywhere only where its trial raised success, several such lessons alone and then together."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from distill.lessons import LessonCurator, decide_gate, live_lessons
from distill.lessons.golive import (
    changed_envs,
    decide_alone,
    decide_candidate,
    decide_together,
    gate_candidate,
    lets_in,
)
from distill.lessons.scope import GLOBAL, ScopedLesson, for_env, scoped_lessons
from distill.lessons.versions import create_version
from memory import EVALUATION_GATE, LESSON_SET_LIVE, ExperienceStore

LEFT, RIGHT = "rooms/left", "rooms/right"
TWO = {LEFT: "text", RIGHT: "text"}
GAMES = 10
A, B = "Take the left door.", "Knock before you enter."


@dataclass
class Stored:
    """A stored lesson as the gate reads one: id, text, scope, pool and metadata."""

    id: int
    text: str
    scope: tuple[str, ...] = GLOBAL
    pool: int = 0
    metadata: dict = field(default_factory=dict)


class Games:
    """Scripted gate games: `wins(env id, frozenset of the texts in its prompt)` of `GAMES` games won; every call
    is recorded as (the texts per environment played)."""

    def __init__(self, wins):
        self.wins, self.calls = wins, []

    def __call__(self, lessons, envs=None):
        envs = list(TWO) if envs is None else envs
        played = {env: frozenset(for_env(lessons, env, TWO.get(env))) for env in envs}
        self.calls.append(played)
        return {
            (env, "validation-0", seed): seed < self.wins(env, texts)
            for env, texts in played.items()
            for seed in range(GAMES)
        }


def decision(current_wins: int, candidate_wins: int, margin: float = 0.05):
    return decide_gate(
        [i < current_wins for i in range(GAMES)], [i < candidate_wins for i in range(GAMES)], margin=margin
    )


def test_a_lesson_proposed_everywhere_must_raise_success_and_a_named_one_only_not_lower_it_by_the_margin() -> None:
    same, up, down = decision(5, 5), decision(5, 6), decision(5, 3)
    assert lets_in(same, everywhere=False) and not lets_in(same, everywhere=True)
    assert lets_in(up, everywhere=False) and lets_in(up, everywhere=True)
    assert not lets_in(down, everywhere=False) and not lets_in(down, everywhere=True)


def test_only_the_environments_whose_prompt_the_candidate_changes_are_played() -> None:
    before = [ScopedLesson(A, (LEFT,))]
    assert changed_envs(before, [*before, ScopedLesson(B, (RIGHT,))], TWO) == [RIGHT]
    assert changed_envs(before, [*before, ScopedLesson(B, ("family:text",))], TWO) == [LEFT, RIGHT]
    assert changed_envs(before, before, TWO) == []


def test_a_candidate_that_changes_no_environment_plays_nothing_and_decides_nothing() -> None:
    live = [Stored(1, A, (LEFT,))]
    games = Games(lambda env, texts: 5)
    outcome = decide_candidate(live, live, live, TWO, games, margin=0.05)
    assert outcome.decisions == {} and outcome.new == [] and games.calls == []


def test_a_lesson_proposed_everywhere_goes_live_only_where_its_trial_raised_success() -> None:
    lesson = Stored(7, A)
    games = Games(lambda env, texts: 5 + (2 if env == LEFT and A in texts else 0))
    outcome = decide_candidate([], [lesson], [lesson], TWO, games, margin=0.05)
    assert outcome.narrowed == {7: [LEFT]} and outcome.dropped == [] and outcome.new == [7]
    assert outcome.decisions[LEFT].promote and outcome.decisions[LEFT].delta == pytest.approx(0.2)
    right = outcome.decisions[RIGHT]
    assert not right.promote and right.reason.startswith("kept out: it did not raise success (candidate 0.500")
    assert set(outcome.scope_trials[7]) == {LEFT, RIGHT} and outcome.scope_trials[7][LEFT]["keys"] == GAMES


def test_in_a_run_of_one_environment_the_gates_own_rule_lets_a_lesson_proposed_everywhere_in() -> None:
    lesson = Stored(7, A)
    outcome = decide_candidate([], [lesson], [lesson], {LEFT: "text"}, Games(lambda env, texts: 5), margin=0.05)
    assert outcome.decisions[LEFT].promote and outcome.narrowed == {} and outcome.dropped == []


def test_a_lesson_for_a_named_environment_goes_live_unless_success_falls_by_more_than_the_margin() -> None:
    lesson = Stored(7, A, (LEFT,))
    small_drop = decide_candidate([], [lesson], [lesson], TWO, Games(lambda env, texts: 5 - (A in texts)), margin=0.1)
    assert small_drop.dropped == [] and small_drop.narrowed == {} and list(small_drop.decisions) == [LEFT]
    big_drop = decide_candidate([], [lesson], [lesson], TWO, Games(lambda env, texts: 5 - 3 * (A in texts)), margin=0.1)
    assert big_drop.dropped == [7] and not big_drop.decisions[LEFT].promote
    assert big_drop.decisions[LEFT].reason.startswith("kept out: success fell by more than the margin 0.100")


def test_lessons_proposed_everywhere_together_are_each_placed_by_their_own_trial() -> None:
    """A raises success on the left only, B on the right only: the set's trial would raise both, so each is tried
    alone and goes live only where it did; they never share an environment, so no combination is played."""
    a, b = Stored(1, A), Stored(2, B)
    games = Games(lambda env, texts: 5 + (A in texts and env == LEFT) + (B in texts and env == RIGHT))
    outcome = decide_candidate([], [a, b], [a, b], TWO, games, margin=0.05)
    assert outcome.narrowed == {1: [LEFT], 2: [RIGHT]} and outcome.dropped == []
    assert outcome.scope_trials[1][RIGHT]["delta"] == 0 and outcome.scope_trials[1][LEFT]["delta"] > 0
    assert len(games.calls) == 4  # the live set, the candidate, each lesson alone


def test_lessons_that_help_alone_but_hurt_together_leave_only_the_best_of_them() -> None:
    a, b = Stored(1, A), Stored(2, B)

    def wins(env, texts):
        if env == RIGHT:
            return 5
        if {A, B} <= texts:
            return 3  # contradictory advice
        return 5 + 2 * (A in texts) + (B in texts)

    outcome = decide_candidate([], [a, b], [a, b], TWO, Games(wins), margin=0.05)
    assert outcome.narrowed == {1: [LEFT]} and outcome.dropped == [2]
    together = outcome.scope_trials[1][LEFT]["together"]
    assert together["with"] == [2] and together["candidate_rate"] == pytest.approx(0.3)
    left = outcome.decisions[LEFT]
    assert left.promote and left.reason.startswith("lessons [2] kept out: it raised success alone (candidate 0.600")


def test_lessons_that_do_at_least_as_well_together_stay_together() -> None:
    a, b = Stored(1, A), Stored(2, B)
    games = Games(lambda env, texts: 5 + (2 * (A in texts) + (B in texts) if env == LEFT else 0))
    outcome = decide_candidate([], [a, b], [a, b], TWO, games, margin=0.05)
    assert outcome.narrowed == {1: [LEFT], 2: [LEFT]} and outcome.dropped == []
    assert outcome.scope_trials[2][LEFT]["together"]["with"] == [1]
    assert outcome.decisions[LEFT].reason.startswith("promoted")


def test_a_lesson_is_tried_alone_only_beside_another_proposed_everywhere_in_a_run_of_several() -> None:
    games = Games(lambda env, texts: 5)
    start = games([], envs=[LEFT, RIGHT])
    one, named = Stored(1, A), Stored(2, B, (LEFT,))
    assert decide_alone(games, start, [], [one, named], [LEFT, RIGHT], 2, 0.05) == {}
    assert decide_alone(games, start, [], [one, Stored(3, B)], [LEFT], 1, 0.05) == {}
    assert len(games.calls) == 1
    alone = decide_alone(games, start, [], [one, Stored(3, B)], [LEFT, RIGHT], 2, 0.05)
    assert set(alone) == {A, B} and set(alone[A]) == {LEFT, RIGHT} and len(games.calls) == 3


def test_a_combination_is_played_only_where_several_lessons_got_in() -> None:
    a, b = Stored(1, A), Stored(2, B)
    games = Games(lambda env, texts: 5 + len(texts))
    start = games([], envs=[LEFT, RIGHT])
    alone = {A: {LEFT: decision(5, 6), RIGHT: decision(5, 6)}, B: {LEFT: decision(5, 6), RIGHT: decision(5, 6)}}
    placed = {1: [LEFT, RIGHT], 2: [LEFT]}
    together = decide_together(games, start, [], [a, b], alone, placed, 0.05)
    assert set(together[1]) == {LEFT} and set(together[2]) == {LEFT}
    assert games.calls[-1] == {LEFT: frozenset({A, B})} and len(games.calls) == 2
    assert placed == {1: [LEFT, RIGHT], 2: [LEFT]}  # 7 of 10 together beats 6 alone: nobody leaves


def test_the_gate_stores_a_row_per_environment_and_narrows_what_it_lets_in(tmp_path) -> None:
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("r", {})
        lesson = store.add_lesson(A, run_id=run_id)
        version = create_version(store, run_id, [lesson], candidate=True).version
        curator = LessonCurator(store, run_id, count_tokens=lambda s: len(s.split()))
        games = Games(lambda env, texts: 5 + (2 if env == LEFT and A in texts else 0))
        outcome = gate_candidate(store, run_id, curator, version, TWO, games, margin=0.05)
        rows = {row.env_id: row.metrics for row in store.evaluations(run_id, kind=EVALUATION_GATE)}
        live, lessons = live_lessons(store, run_id)
        (stored,) = store.lessons(run_id, ids=[lesson])
    assert outcome.reason.startswith(f"promoted; 1 narrowed to the environments that let them in: {LEFT}: promoted")
    assert set(rows) == {LEFT, RIGHT} and rows[LEFT]["promote"] and not rows[RIGHT]["promote"]
    assert live.status == LESSON_SET_LIVE and live.lesson_ids == [lesson] and [x.id for x in lessons] == [lesson]
    assert tuple(stored.scope) == (LEFT,) and stored.metadata["proposed_scope"] == list(GLOBAL)
    assert scoped_lessons([stored])[0].gains == ((LEFT, pytest.approx(0.2)), (RIGHT, 0.0))


def test_the_gate_rejects_a_candidate_no_environment_lets_in(tmp_path) -> None:
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("r", {})
        version = create_version(store, run_id, [store.add_lesson(A, run_id=run_id)], candidate=True).version
        curator = LessonCurator(store, run_id, count_tokens=lambda s: len(s.split()))
        outcome = gate_candidate(store, run_id, curator, version, TWO, Games(lambda env, texts: 5), margin=0.05)
        live, lessons = live_lessons(store, run_id)
    assert outcome.dropped == outcome.new and outcome.reason.startswith("kept out of every environment it would enter")
    assert lessons == [] and (live is None or live.version != version)
