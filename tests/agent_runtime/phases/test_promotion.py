"""The promotion's no-regression check on validation games counts games, not only points: on 8 games one game is
12.5 points, over any margin, so a margin alone rolled back a cycle for one flipped game (the mixed study's seeds 2
and 3: coin-collector 0% -> 100% on its validation games, treasure-hunter 6/8 -> 5/8, rolled back)."""

from __future__ import annotations

from agent_runtime.config import ConsolidationConfig
from agent_runtime.phases.promotion import decide_cycle

COIN, TREASURE = "textworld/coin_collector", "textworld/treasure_hunter"
CONDITIONS = (
    "validation_student",
    "validation_parent",
    "validation_student_with_lessons",
    "validation_parent_with_lessons",
)


def _decide(treasure_student: float, *, regression_games: int = 2, games: int | None = 8):
    """The mixed study's seed-2 cycle: coin-collector learned, treasure-hunter's student at `treasure_student`
    against its parent's 0.75, on `games` validation games per environment (None: counts not given)."""
    by_env = {
        "validation_parent": {COIN: 0.0, TREASURE: 0.75},
        "validation_student": {COIN: 1.0, TREASURE: treasure_student},
        "validation_parent_with_lessons": {COIN: 0.625, TREASURE: 0.75},
        "validation_student_with_lessons": {COIN: 1.0, TREASURE: 0.75},
    }
    rates = {
        "teacher_without_lessons": 0.44,
        "student_without_lessons": 0.94,
        "teacher_with_lessons": 0.81,
        "student_with_lessons": 0.94,
        "validation_parent": 0.375,
        "validation_student": (1.0 + treasure_student) / 2,
    }
    counts = {c: {COIN: games, TREASURE: games} for c in CONDITIONS} if games else None
    return decide_cycle(
        rates,
        (0.291, 0.036),
        ({}, {}),
        ConsolidationConfig(regression_games=regression_games),
        by_env=by_env,
        played=[COIN, TREASURE],
        changed=[],
        games=counts,
    )


def test_one_game_lost_on_validation_is_let_through_and_said():
    decision = _decide(0.625)  # 6/8 -> 5/8
    assert decision.promoted, decision.reasons
    [why, note] = decision.reasons
    assert "held-out KL 0.2910 -> 0.0360" in why
    assert f"without lessons on {TREASURE}'s validation games" in note
    assert "by 1 game of 8: too few to be a regression (opcd.regression_games 2)" in note


def test_two_games_lost_on_validation_are_a_regression():
    decision = _decide(0.5)  # 6/8 -> 4/8
    assert not decision.promoted
    expected = (
        f"without lessons on {TREASURE}'s validation games: student 0.50 fell below the parent's 0.75 by more than "
        "0.05 (2 games of 8)"
    )
    assert decision.reasons == [expected]


def test_regression_games_1_is_any_drop_over_the_margin():
    decision = _decide(0.625, regression_games=1)
    assert not decision.promoted
    assert "(1 game of 8)" in decision.reasons[0]


def test_without_game_counts_any_drop_over_the_margin_is_a_regression():
    decision = _decide(0.625, games=None)
    assert not decision.promoted
    assert decision.reasons == [
        f"without lessons on {TREASURE}'s validation games: student 0.62 fell below the parent's 0.75 by more than 0.05"
    ]


def test_on_twenty_games_one_game_is_within_the_margin_and_two_are_not():
    """At 20 games a game is 5 points: one is no drop over the margin at all, two are a regression."""
    assert _decide(0.70, games=20).reasons[1:] == []
    assert not _decide(0.65, games=20).promoted
