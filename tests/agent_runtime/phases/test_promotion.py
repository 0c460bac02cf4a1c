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


# -- the second look: a one-game drop is played again on more games before the decision -------------------------------


class _Adapters:
    """A backend that acts with adapters by name; what it plays is the fake run's."""

    def __init__(self):
        self.adapters: dict = {}
        self.active_adapter = None

    def load_adapter(self, name, path):
        self.adapters[name] = path

    def use_adapter(self, name):
        self.active_adapter = name


def _recheck_run(student_losses: set[int], recheck_games: int = 8):
    """A run of two rooms, 8 validation games each, whose parent wins every game and whose student wins every
    game but those numbered in `student_losses` in the right room; it records what it was asked to play."""
    from types import SimpleNamespace

    from agent_runtime.config import config_from_dict
    from agent_runtime.evaluation import EvalResult
    from tests.continual_envs import LEFT, RIGHT

    config = config_from_dict(
        {
            "name": "recheck",
            "envs": [{"id": LEFT}, {"id": RIGHT}],
            "model": {"name": "scripted", "backend": "scripted"},
            "opcd": {"validation_games": 8, "recheck_games": recheck_games},
        }
    )
    asked = []

    def evaluate(backend, *, episodes_per_env, envs=None, split="eval", first=0, **shown):
        who = backend.active_adapter or "parent"
        asked.append((who, [e.id for e in envs], first, episodes_per_env, split))
        return [
            EvalResult(
                e.id,
                [
                    {"seed": i, "won": not (who != "parent" and e.id == RIGHT and i in student_losses)}
                    for i in range(first, first + episodes_per_env)
                ],
            )
            for e in envs
        ]

    run = SimpleNamespace(config=config, families={}, evaluate=evaluate)
    return run, asked, LEFT, RIGHT


def _validated(run, student_losses):
    """The first validation games of both, as `evaluate_cycle` plays them, then the second look."""
    from types import SimpleNamespace

    from agent_runtime.llm.base import acting
    from agent_runtime.phases import cycle_evaluation

    backend, student = _Adapters(), SimpleNamespace(name="cycle-1", path="adapters/cycle-1")
    cycle = SimpleNamespace(parent=None, metrics={})
    evals = {}
    for who, adapter in (("parent", None), ("student", student)):
        with acting(backend, adapter):
            evals.update(cycle_evaluation._validate(run, backend, who, {"lessons": []}))
    cycle_evaluation._recheck(run, backend, cycle, student, evals, {"lessons": []})
    by_env, games = cycle_evaluation.rates_and_games(evals)
    rates = {k: sum(r.successes for r in v) / sum(r.n for r in v) for k, v in evals.items()}
    rates.update(teacher_without_lessons=0.5, student_without_lessons=0.5, teacher_with_lessons=0.5)
    decision = decide_cycle(rates, (0.3, 0.03), ({}, {}), run.config.opcd, by_env=by_env, changed=[], games=games)
    return decision, cycle.metrics


def test_a_one_game_drop_is_played_again_and_two_more_lost_games_roll_the_cycle_back():
    run, asked, left, right = _recheck_run({3, 9, 12})
    decision, metrics = _validated(run, {3, 9, 12})
    assert not decision.promoted
    assert decision.reasons == [
        (
            f"without lessons on {right}'s validation games: student 0.81 fell below the parent's 1.00 by more "
            "than 0.05 (3 games of 16)"
        )
    ]
    # the first look: both rooms, 8 games each; the second: the right room only, the next 8 train tasks, both sides
    assert asked[:2] == [("parent", [left, right], 0, 8, "validation"), ("cycle-1", [left, right], 0, 8, "validation")]
    assert asked[2:] == [("parent", [right], 8, 8, "validation"), ("cycle-1", [right], 8, 8, "validation")]
    assert metrics["rechecked"] == {right: 16}


def test_a_one_game_drop_that_stays_one_game_on_more_games_is_let_through_and_said():
    run, asked, *_ = _recheck_run({3})
    decision, _ = _validated(run, {3})
    assert decision.promoted, decision.reasons
    assert "student 0.94 fell below the parent's 1.00 by more than 0.05, but by 1 game of 16" in decision.reasons[1]
    assert len(asked) == 4


def test_no_second_look_without_a_close_drop_or_with_recheck_games_0():
    run, asked, *_ = _recheck_run(set())
    _, metrics = _validated(run, set())
    assert len(asked) == 2 and "rechecked" not in metrics
    run, asked, *_ = _recheck_run({3}, recheck_games=0)
    decision, metrics = _validated(run, {3})
    assert len(asked) == 2 and "rechecked" not in metrics
    assert decision.promoted and "but by 1 game of 8" in decision.reasons[1]
