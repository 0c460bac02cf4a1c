"""What a decision on n paired games can see: the smallest drop the promotion flags and the smallest gain a lesson's
trial shows, at the configured sizes.

A decision here compares two policies on the same games (parent and student, the live lessons and a candidate) and
acts on the net count of games that changed. Its rules are thresholds on that count:
- the promotion rolls a cycle back on an environment when the student lost more than `margin` of the validation
  games, and at least `regression_games` of them (`agent_runtime.phases.promotion`);
- a lesson's trial lets it in where it raised success by at least one game net (a lesson proposed for every
  environment), or did not lower it by more than `margin` (`distill.lessons.gate`).

The threshold says which observed change acts. What a user needs is which *true* change is seen: a policy that loses
a fraction d of the games it used to win (or, for a gain, wins d more) changes each game with probability d, so the
count of changed games is Binomial(n, d), and the rule sees the change when that count reaches its threshold. The
detectable change at a power (0.8 by default) is the smallest d seen that often. This model counts changes in one
direction only; games that move the other way as well (a student that wins some and loses others) make every
figure here an optimistic bound, which is the right side for a warning that a fold is too small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

POWER = 0.8


def _at_least(n: int, k: int, p: float) -> float:
    """P(Binomial(n, p) >= k)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _smallest_seen(n: int, k: int, power: float) -> float | None:
    """The smallest d in [0, 1] with P(Binomial(n, d) >= k) >= power (None: not even d = 1, i.e. k > n)."""
    if k > n:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):  # the probability rises with d; bisection to well below a game's resolution
        mid = (low + high) / 2
        if _at_least(n, k, mid) >= power:
            high = mid
        else:
            low = mid
    return high


@dataclass(frozen=True)
class Sight:
    """What a rule on `n` paired games acts on (`games`: the net changed games it needs, `rate` = games / n) and the
    smallest true change it sees with probability `power` (`change`; None when n is too small to ever see one)."""

    n: int
    games: int
    rate: float
    change: float | None
    power: float

    def line(self, what: str) -> str:
        if self.change is None:
            return f"{what}: {self.n} games can never show {self.games} changed games"
        return (
            f"{what}: acts at {self.games} game{'s' if self.games != 1 else ''} of {self.n} ({self.rate:.0%}); "
            f"a true change of {self.change:.0%} is seen {self.power:.0%} of the time"
        )


def promotion_sight(n: int, margin: float, regression_games: int, power: float = POWER) -> Sight:
    """The drop the promotion's rule sees on `n` validation games of one environment: it acts when the student lost
    over `margin` of them (more than margin * n games) and at least `regression_games`."""
    assert n > 0, f"promotion_sight needs games, got n={n}"
    games = max(regression_games, math.floor(margin * n + 1e-9) + 1)
    return Sight(n, games, games / n, _smallest_seen(n, games, power), power)


def trial_sight(n: int, power: float = POWER) -> Sight:
    """The gain a lesson's trial sees on `n` games of one environment: it needs at least one game won net."""
    assert n > 0, f"trial_sight needs games, got n={n}"
    return Sight(n, 1, 1 / n, _smallest_seen(n, 1, power), power)


def games_to_see(change: float, rule, power: float = POWER, limit: int = 10_000) -> int | None:
    """The fewest games n for which `rule(n)` (a function of n returning a `Sight`) sees a true `change` with
    probability `power`; None past `limit` games."""
    assert 0 < change <= 1, f"a change is a fraction of the games in (0, 1], got {change}"
    for n in range(1, limit + 1):
        sight = rule(n)
        if sight.change is not None and sight.change <= change:
            return n
    return None
