"""PROMOTE or ROLLBACK: the rules a cycle's adapter must pass, said once (pure functions over the cycle's rates and
KL measurements, and what changed in the store while it trained). `agent_runtime.phases.consolidate` applies them."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_runtime.config import ConsolidationConfig, RunConfig
from distill.evidence import promotion_sight, trial_sight
from memory import ExperienceStore

# The drop the promotion must see: the one-action quests lost 3-4 of their 20 held-out games (15-20 points) to cycles
# that a promotion reading the train fold let through (bench/RESULTS.md, "Continual learning").
VISIBLE_DROP = 0.20


@dataclass(frozen=True)
class CycleDecision:
    """PROMOTE (with the lessons the adapter internalised) or ROLLBACK, and why."""

    promoted: bool
    reasons: list[str]
    consolidated: list[int] = field(default_factory=list)


def decide_cycle(
    rates: dict[str, float],
    kl: tuple[float, float],
    lesson_kl: tuple[dict, dict],
    opcd: ConsolidationConfig,
    *,
    by_env: dict[str, dict[str, float]],
    changed: list[str],
    games: dict[str, dict[str, int]] | None = None,
) -> CycleDecision:
    """The whole decision on a cycle that trained: `decide_promotion`'s rules and what `changed` in the store
    while it trained (`changed_meanwhile`) roll it back; a promoted one lists the lessons it internalised, and
    the drops on validation games it let through as too few games to be a regression (`opcd.regression_games`).
    `games`: each condition's number of games per environment (what turns a drop in rate into games)."""
    (before, after), (lesson_before, lesson_after) = kl, lesson_kl
    reasons = decide_promotion(rates, before, after, opcd, by_env=by_env, games=games) + changed
    if reasons:
        return CycleDecision(False, reasons)
    student, parent = (
        ("validation_student", "validation_parent")
        if "validation_student" in rates
        else ("student_without_lessons", "teacher_without_lessons")
    )
    why = (
        f"held-out KL {before:.4f} -> {after:.4f}; student without lessons {rates[student]:.2f} vs parent "
        f"{rates[parent]:.2f} on the {'validation' if student.startswith('validation') else 'held-out'} games "
        f"(margin {opcd.promote_margin})"
    )
    tolerated = [d.line for d in validation_drops(by_env, opcd, games) if not d.regression]
    return CycleDecision(True, [why, *tolerated], internalized_lessons(lesson_before, lesson_after, rates, opcd))


def decide_promotion(
    rates: dict[str, float],
    kl_before: float,
    kl_after: float,
    opcd: ConsolidationConfig,
    *,
    by_env: dict[str, dict[str, float]] | None = None,
    games: dict[str, dict[str, int]] | None = None,
) -> list[str]:
    """The reasons not to promote a cycle's adapter (none: promote). Evidence is needed both ways.

    1. Learning: the held-out KL of the student without lessons to the teacher with them fell by `min_kl_drop` of
       its start-of-cycle value, or (with validation games) the student without lessons won more of the
       validation games than the parent by over `promote_margin`. A KL on a handful of prompts is noisy, and a
       student that sharpens the teacher's preference past it plays better while its KL rises.
    2. No regression: no evaluated condition fell below its reference by more than its margin. With validation
       games (`by_env`, each condition's rate per environment) it is judged there, in every environment of the
       run, played yet or not (a cycle that costs one the agent has still to meet is negative forward transfer),
       and every retention environment, without and with the lessons: the held-out games stay the report's.
       There a drop must also be `opcd.regression_games` games or more (`games` gives each condition's games per
       environment; without it, any drop over the margin). Without validation games, on the held-out
       conditions pooled, as before."""
    reasons = []
    validated = "validation_student" in rates and "validation_parent" in rates
    gain = rates["validation_student"] - rates["validation_parent"] if validated else None
    if not kl_before > 0:
        reasons.append(
            f"held-out KL before training is {kl_before:.4f}: the lessons do not change the policy, "
            "there is nothing to distil"
        )
    elif not kl_after <= (1.0 - opcd.min_kl_drop) * kl_before and not (gain is not None and gain > opcd.promote_margin):
        won = (
            (
                f", and the student won {rates['validation_student']:.2f} of the validation games against the "
                f"parent's {rates['validation_parent']:.2f} (needs over +{opcd.promote_margin})"
            )
            if validated
            else ""
        )
        reasons.append(f"held-out KL {kl_before:.4f} -> {kl_after:.4f} did not fall by {opcd.min_kl_drop:.0%}{won}")
    if validated and by_env is not None:
        return reasons + [d.line for d in validation_drops(by_env, opcd, games) if d.regression]
    without = (
        ("validation_student", "validation_parent")
        if validated
        else ("student_without_lessons", "teacher_without_lessons")
    )
    pairs = [
        (*without, opcd.promote_margin, "without lessons"),
        ("student_with_lessons", "teacher_with_lessons", opcd.promote_margin, "with lessons"),
        ("student_retention", "teacher_retention", opcd.retention_margin, "retention"),
    ]
    for student, parent, margin, what in pairs:
        if student in rates and parent in rates and rates[student] < rates[parent] - margin:
            reasons.append(
                f"{what}: student {rates[student]:.2f} fell below the parent's {rates[parent]:.2f} "
                f"by more than {margin}"
            )
    return reasons


@dataclass(frozen=True)
class Drop:
    """One environment where the student fell below its parent on the validation games by more than the margin,
    without or with the lessons (`what`), or on a retention environment; `lost` games net of `n` (None: only the
    rates are known)."""

    what: str
    env: str
    student: float
    parent: float
    margin: float
    lost: int | None
    n: int | None
    regression_games: int

    @property
    def regression(self) -> bool:
        """Over the margin and `regression_games` games or more (any drop over the margin without game counts)."""
        return self.lost is None or self.lost >= self.regression_games

    @property
    def line(self) -> str:
        line = (
            f"{self.what} on {self.env}'s validation games: student {self.student:.2f} fell below the parent's "
            f"{self.parent:.2f} by more than {self.margin}"
        )
        if self.lost is None:
            return line
        counted = f"{self.lost} game{'s' if self.lost != 1 else ''} of {self.n}"
        if self.regression:
            return f"{line} ({counted})"
        return f"{line}, but by {counted}: too few to be a regression (opcd.regression_games {self.regression_games})"


_CHECKS = (  # (student's condition, parent's condition, which margin, what)
    ("validation_student", "validation_parent", "promote_margin", "without lessons"),
    ("validation_student_with_lessons", "validation_parent_with_lessons", "promote_margin", "with lessons"),
    ("validation_student_retention", "validation_parent_retention", "retention_margin", "retention"),
)


def validation_drops(
    by_env: dict[str, dict[str, float]], opcd: ConsolidationConfig, games: dict[str, dict[str, int]] | None
) -> list[Drop]:
    """Every environment with validation games (each of the run's, each retention one) where the student fell
    below its parent by more than the margin, without or with the lessons; each a regression or a drop of fewer
    than `opcd.regression_games` games net (known from `games`), let through and said."""
    drops = []
    for student, parent, margin_name, what in _CHECKS:
        mine, theirs = by_env.get(student, {}), by_env.get(parent, {})
        margin = getattr(opcd, margin_name)
        for env in sorted(set(mine) & set(theirs)):
            if not mine[env] < theirs[env] - margin:
                continue
            n = (games or {}).get(student, {}).get(env) or None
            lost = round((theirs[env] - mine[env]) * n) if n else None
            drops.append(Drop(what, env, mine[env], theirs[env], margin, lost, n, opcd.regression_games))
    return drops


def internalized_lessons(
    kl_before: dict[int, float], kl_after: dict[int, float], rates: dict[str, float], opcd: ConsolidationConfig
) -> list[int]:
    """The lessons a promoted adapter has internalised, which leave the context: the student's held-out KL to
    the teacher with the lesson fell to `internalized_ratio` of its start-of-cycle value (the KL on the cycle's own
    held-back prompts), and the student without lessons does as well as the parent with them (within
    `promote_margin`) on the validation games: a decision, so never on the held-out games the tables report (a stored
    run without validation games falls back to them, flagged by `ConsolidationConfig.held_out_decisions`)."""
    if "validation_student" in rates:
        parent = rates.get("validation_parent_with_lessons", rates["validation_parent"])
        as_good = rates["validation_student"] >= parent - opcd.promote_margin
    else:
        as_good = rates["student_without_lessons"] >= rates["teacher_with_lessons"] - opcd.promote_margin
    return [i for i in kl_before if kl_after[i] <= opcd.internalized_ratio * kl_before[i] and as_good]


def changed_meanwhile(store: ExperienceStore, run_id: int, live, parent) -> list[str]:
    """Reasons not to promote that arose while the cycle trained: its parent is no longer the run's adapter
    (`lessons forget` rolled it back), or a lesson it was taught with has been forgotten."""
    reasons = []
    active = store.active_adapter(run_id)
    if (active.id if active else None) != (parent.id if parent else None):
        reasons.append(
            f"the run's adapter changed during the cycle (parent {parent.name if parent else 'base'}, "
            f"now {active.name if active else 'base'}): a lesson was forgotten"
        )
    taught = store.lessons(run_id, ids=live.lesson_ids) if live is not None and live.lesson_ids else []
    forgotten = [x.id for x in taught if x.forgotten_at is not None]
    if forgotten:
        reasons.append(f"lessons {forgotten} it was taught with were forgotten during the cycle")
    return reasons


def decision_sights(config: RunConfig) -> list[tuple[str, bool]]:
    """What the run's decisions can see at their configured sizes, one line each with whether it is a warning: the
    smallest drop the promotion sees on each environment's validation games, 4 times in 5 (a warning past
    `VISIBLE_DROP`), and the smallest gain a lesson's trial and the gate's decision see."""
    out: list[tuple[str, bool]] = []
    opcd, lessons = config.opcd, config.lessons
    if opcd.enabled and opcd.validation_games:
        sight = promotion_sight(opcd.validation_games, opcd.promote_margin, opcd.regression_games)
        line = sight.line(f"the promotion on {opcd.validation_games} {opcd.validation_split} games per environment")
        blind = sight.change is None or sight.change > VISIBLE_DROP
        if blind:
            line += (
                f"; it misses drops of {VISIBLE_DROP:.0%} (3-4 games of 20) more often than 1 time in 5: give "
                "opcd.validation_games 14 or more"
            )
        out.append((line, blind))
    if lessons.enabled and lessons.gate_episodes:
        out.append(
            (trial_sight(lessons.gate_episodes).line(f"a lesson's trial on {lessons.gate_episodes} games"), False)
        )
    return out
