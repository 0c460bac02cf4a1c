"""What a decision on n paired games can see: the thresholds agree with the rules that act on them, and the detectable
change falls as the games grow."""

import math

import pytest

from agent_runtime.config.schema import ConsolidationConfig
from agent_runtime.phases.promotion import validation_drops
from distill.evidence import _at_least, games_to_see, promotion_sight, trial_sight


@pytest.mark.parametrize("n", [4, 8, 12, 16, 20, 24, 40, 60])
@pytest.mark.parametrize("margin,regression_games", [(0.05, 2), (0.0, 1), (0.1, 2), (0.05, 3)])
def test_promotion_threshold_is_where_the_rule_acts(n, margin, regression_games):
    opcd = ConsolidationConfig(promote_margin=margin, regression_games=regression_games)
    sight = promotion_sight(n, margin, regression_games)

    def regressed(lost: int) -> bool:
        parent = 1.0
        by_env = {"validation_student": {"e": (n - lost) / n * parent}, "validation_parent": {"e": parent}}
        games = {"validation_student": {"e": n}}
        return any(d.regression for d in validation_drops(by_env, opcd, games))

    if sight.games <= n:
        assert regressed(sight.games)
    assert not regressed(sight.games - 1)


def test_detectable_change_is_the_smallest_seen_at_the_power():
    sight = promotion_sight(20, 0.05, 2)
    assert sight.games == 2
    assert _at_least(20, 2, sight.change) == pytest.approx(0.8, abs=1e-6)
    assert _at_least(20, 2, sight.change - 0.01) < 0.8


def test_more_games_see_smaller_changes():
    changes = [promotion_sight(n, 0.05, 2).change for n in (8, 16, 24, 40)]
    assert changes == sorted(changes, reverse=True) and changes[0] > changes[-1]
    assert trial_sight(24).change < trial_sight(12).change


def test_a_rule_that_needs_more_games_than_it_has_sees_nothing():
    sight = promotion_sight(1, 0.05, 2)
    assert sight.change is None and "never" in sight.line("promotion")


def test_trial_sees_a_gain_of_one_game_net():
    sight = trial_sight(12)
    assert sight.games == 1
    assert sight.change == pytest.approx(1 - 0.2 ** (1 / 12), abs=1e-6)  # P(no changed game) = 0.2


def test_games_to_see_is_the_fewest_that_suffice():
    n = games_to_see(0.15, lambda k: promotion_sight(k, 0.05, 2))
    assert promotion_sight(n, 0.05, 2).change <= 0.15 < promotion_sight(n - 1, 0.05, 2).change
    assert games_to_see(0.01, trial_sight, limit=50) is None
    with pytest.raises(AssertionError):
        games_to_see(0.0, trial_sight)
    assert math.isclose(_at_least(5, 0, 0.3), 1.0) and _at_least(5, 6, 0.3) == 0.0
