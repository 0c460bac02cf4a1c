"""The validation gate (promote or block a candidate lesson set) and per-lesson utility.

What:
- `decide_gate(current, candidate, *, margin=0.05) -> GateDecision`: the per-episode outcomes (won
  or not, or a success in [0, 1]) of the current and the candidate lesson set on the SAME games (of
  `lessons.gate_split`, never the held-out games the tables report) -- two mappings keyed by seed (or by
  (task, seed)), or two equally long sequences in the same seed order. The candidate is blocked when its success rate is lower than the current set's by more
  than `margin`; otherwise it is promoted. The decision carries its numbers: n, successes, rates, the
  paired delta, 95% Wilson intervals for each rate (`memory.intervals.wilson_interval`) and a 95% interval for
  the paired delta.
- `store_gate_decision(store, decision, run_id=, env_id=, current_version=, candidate_version=)`:
  kept as an evaluation row of kind `memory.EVALUATION_GATE` (the decision in `metrics`), so every
  promotion or block can be audited later.
- `lesson_utilities(episodes, lessons, *, min_episodes=3) -> dict[int, LessonUtility]`: success rate
  of the logged episodes that had the lesson in context (`EpisodeInfo.lessons_in_context`) minus that
  of the episodes of the same environments without it. A merged lesson also counts the episodes of the
  lessons it merged (`merged_from`, transitively). Ablation runs are simply more logged episodes without the lesson.
- `measure_utilities(store, run_id, ...)`, `store_utilities(store, run_id, utilities)`,
  `load_utilities(store, run_id) -> dict[int, float]` (what `LessonCurator(utilities=...)` takes); kept as
  evaluation rows of kind `memory.EVALUATION_LESSON_UTILITY`.

Why these choices: the rule is the point estimate against a margin because with
the few episodes a CPU run affords, a confidence-interval rule would promote nearly everything; the
intervals are reported so a reader can judge. The comparison is paired (same seeds) so that task
difficulty cancels out. Utilities are stored as an evaluation row because lesson rows are immutable
(see `distill.lessons.versions`); the newest row wins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from distill.lessons.errors import GateInputError
from memory import EVALUATION_GATE, EVALUATION_LESSON_UTILITY
from memory.intervals import Z95, wilson_interval

if TYPE_CHECKING:
    from memory import EpisodeInfo, ExperienceStore, LessonInfo

Outcomes = Mapping[Any, "bool | float"] | Sequence["bool | float"]


def paired_interval(diffs: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """A normal-approximation interval of the mean of paired differences (-1..1)."""
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return (max(-1.0, mean - 1.0), min(1.0, mean + 1.0))
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    half = z * math.sqrt(var / n)
    return (max(-1.0, mean - half), min(1.0, mean + half))


@dataclass(frozen=True)
class GateDecision:
    """Whether to promote the candidate set, why, and the numbers behind it."""

    promote: bool
    reason: str
    n: int
    margin: float
    current_successes: float
    candidate_successes: float
    current_rate: float
    candidate_rate: float
    delta: float
    current_ci: tuple[float, float]
    candidate_ci: tuple[float, float]
    delta_ci: tuple[float, float]
    keys: list[Any]

    @property
    def summary(self) -> str:
        """The numbers the decision rests on, in words: both rates, the paired games and the delta."""
        return _summary(self.candidate_rate, self.current_rate, self.n, self.delta)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["keys"] = [list(k) if isinstance(k, tuple) else k for k in self.keys]
        for name in ("current_ci", "candidate_ci", "delta_ci"):
            out[name] = list(out[name])
        return out


def _summary(candidate_rate: float, current_rate: float, n: int, delta: float) -> str:
    return f"candidate {candidate_rate:.3f} vs current {current_rate:.3f} on {n} paired game(s), delta {delta:+.3f}"


def mcnemar_p(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Exact two-sided McNemar p-value of paired outcomes: a binomial test (p = 1/2) on the discordant pairs."""
    up = sum(1 for x, y in zip(a, b) if y and not x)
    down = sum(1 for x, y in zip(a, b) if x and not y)
    n = up + down
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, k) for k in range(min(up, down) + 1)) / 2**n)


def _score(value: bool | float) -> float:
    score = float(value)
    if not 0.0 <= score <= 1.0:
        raise GateInputError(f"an outcome must be won/lost or a success in [0, 1], got {value!r}")
    return score


def _paired(current: Outcomes, candidate: Outcomes) -> tuple[list[Any], list[float], list[float]]:
    if isinstance(current, Mapping) != isinstance(candidate, Mapping):
        raise GateInputError("give both outcome sets as mappings (seed -> outcome) or both as sequences")
    if isinstance(current, Mapping) and isinstance(candidate, Mapping):
        if set(current) != set(candidate):
            only_a = sorted(map(str, set(current) - set(candidate)))[:5]
            only_b = sorted(map(str, set(candidate) - set(current)))[:5]
            raise GateInputError(
                "the gate compares lesson sets on the same seeds; only the current set has "
                f"{only_a}, only the candidate has {only_b}"
            )
        keys = list(current)
        return keys, [_score(current[k]) for k in keys], [_score(candidate[k]) for k in keys]
    if len(current) != len(candidate):
        raise GateInputError(
            f"the gate compares lesson sets on the same seeds; got {len(current)} current and "
            f"{len(candidate)} candidate outcomes"
        )
    return list(range(len(current))), [_score(x) for x in current], [_score(x) for x in candidate]


def decide_gate(current: Outcomes, candidate: Outcomes, *, margin: float = 0.05) -> GateDecision:
    """Promote the candidate unless its success rate is lower than the current one by more than margin."""
    if not 0.0 <= margin <= 1.0:
        raise GateInputError(f"the gate margin must lie in [0, 1], got {margin}")
    keys, cur, cand = _paired(current, candidate)
    n = len(keys)
    if n == 0:
        raise GateInputError("the gate needs at least one paired episode; set gate_episodes > 0")
    cur_s, cand_s = sum(cur), sum(cand)
    cur_rate, cand_rate = cur_s / n, cand_s / n
    delta = cand_rate - cur_rate
    promote = delta >= -margin - 1e-12
    verdict = "promoted" if promote else "blocked"
    reason = f"{verdict}: {_summary(cand_rate, cur_rate, n, delta)} (a drop of more than {margin:.3f} blocks)"
    return GateDecision(
        promote=promote,
        reason=reason,
        n=n,
        margin=margin,
        current_successes=cur_s,
        candidate_successes=cand_s,
        current_rate=cur_rate,
        candidate_rate=cand_rate,
        delta=delta,
        current_ci=wilson_interval(cur_s, n),
        candidate_ci=wilson_interval(cand_s, n),
        delta_ci=paired_interval([b - a for a, b in zip(cur, cand)]),
        keys=keys,
    )


def store_gate_decision(
    store: ExperienceStore,
    decision: GateDecision,
    *,
    run_id: int | None,
    env_id: str,
    current_version: int | None,
    candidate_version: int,
) -> int:
    """Keep the decision as an evaluation row (kind "gate"); returns its id."""
    metrics = decision.to_dict() | {
        "current_version": current_version,
        "candidate_version": candidate_version,
    }
    return store.add_evaluation(
        env_id,
        run_id=run_id,
        lesson_set_version=candidate_version,
        split=EVALUATION_GATE,  # not a task split: the value these rows always had (readers use `kind`)
        kind=EVALUATION_GATE,
        policy="lesson-gate",
        num_episodes=decision.n,
        success_rate=decision.candidate_rate,
        metrics=metrics,
    )


@dataclass(frozen=True)
class LessonUtility:
    """Success with a lesson in context against success without it, on logged episodes."""

    lesson_id: int
    n_with: int
    wins_with: int
    n_without: int
    wins_without: int
    min_episodes: int = 3

    @property
    def rate_with(self) -> float | None:
        return self.wins_with / self.n_with if self.n_with else None

    @property
    def rate_without(self) -> float | None:
        return self.wins_without / self.n_without if self.n_without else None

    @property
    def utility(self) -> float | None:
        """rate_with - rate_without, or None with fewer than `min_episodes` on either side."""
        if self.n_with < self.min_episodes or self.n_without < self.min_episodes:
            return None
        assert self.rate_with is not None and self.rate_without is not None
        return self.rate_with - self.rate_without

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "rate_with": self.rate_with,
            "rate_without": self.rate_without,
            "utility": self.utility,
        }


def lesson_utilities(
    episodes: Iterable[EpisodeInfo],
    lessons: Iterable[LessonInfo],
    *,
    min_episodes: int = 3,
    measure: Iterable[int] | None = None,
) -> dict[int, LessonUtility]:
    """Per lesson: wins/episodes with it in context vs. without it, in the environments where it was used
    (a merged lesson counts the episodes of everything it merged). `measure`: the ids to measure (default:
    all of `lessons`, which also give the merge graph).

    Episodes that ended in an error are left out (they say nothing about the lessons).
    """
    played = [e for e in episodes if e.outcome != "error"]
    lessons = list(lessons)
    parents = {x.id: [int(i) for i in x.metadata.get("merged_from", [])] for x in lessons}
    wanted = set(measure) if measure is not None else None
    result = {}
    for lesson in lessons:
        if wanted is not None and lesson.id not in wanted:
            continue
        family, todo = set(), [lesson.id]
        while todo:  # the lesson and everything it merged, transitively
            current = todo.pop()
            if current not in family:
                family.add(current)
                todo += parents.get(current, [])
        with_it = [e for e in played if family & set(e.lessons_in_context)]
        envs = {e.env_id for e in with_it}
        without = [e for e in played if e.env_id in envs and not family & set(e.lessons_in_context)]
        result[lesson.id] = LessonUtility(
            lesson.id,
            n_with=len(with_it),
            wins_with=sum(e.won for e in with_it),
            n_without=len(without),
            wins_without=sum(e.won for e in without),
            min_episodes=min_episodes,
        )
    return result


def measure_utilities(
    store: ExperienceStore, run_id: int, *, limit: int = 5000, min_episodes: int = 3
) -> dict[int, LessonUtility]:
    """`lesson_utilities` over the run's newest `limit` episodes, for the lessons that can still enter a
    context (proposed and active: a retired or consolidated lesson's utility decides nothing any more, and
    measuring every lesson ever written made each EXTRACT slower as the run grew)."""
    episodes = store.episodes(run_id, limit=limit)
    every = store.lessons(run_id)
    live = [x.id for x in every if x.status in ("proposed", "active")]
    return lesson_utilities(episodes, every, min_episodes=min_episodes, measure=live)


def store_utilities(
    store: ExperienceStore, run_id: int | None, utilities: Mapping[int, LessonUtility], *, env_id: str = "*"
) -> int:
    """Keep measured utilities as an evaluation row (kind "lesson-utility"); returns its id."""
    return store.add_evaluation(
        env_id,
        run_id=run_id,
        split=EVALUATION_LESSON_UTILITY,  # not a task split: the value these rows always had
        kind=EVALUATION_LESSON_UTILITY,
        policy="logged-episodes",
        num_episodes=max((u.n_with + u.n_without for u in utilities.values()), default=0),
        metrics={"utilities": {str(k): u.to_dict() for k, u in utilities.items()}},
    )


def load_utilities(store: ExperienceStore, run_id: int | None) -> dict[int, float]:
    """The newest stored utilities of the run: lesson id -> utility (lessons without enough data left out)."""
    newest = store.latest_evaluation(run_id, kind=EVALUATION_LESSON_UTILITY)
    if newest is None:
        return {}
    stored = newest.metrics.get("utilities", {})
    return {int(k): float(v["utility"]) for k, v in stored.items() if v.get("utility") is not None}
