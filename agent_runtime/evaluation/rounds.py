"""A long-lived run, round by round: what each round (one curriculum phase and its assessment) left behind, in one
line, and the figures that say whether a family stays learned when others come and go.

Each assessment stores, beside its matrix row, a round record (`metrics.continual.round` of each environment's row):
- per environment: the live lessons in its scope and their tokens (the lesson block its prompt holds), and the
  acting adapter's drift from the base model (`agent_runtime.evaluation.drift`);
- for the round: each top-level phase's wall seconds since the previous assessment (its own assessment until the
  record is taken), the process's resident memory at the assessment and its peak over every phase so far (flat
  peaks from round to round: nothing grows with the store), and the adapter that acted.
A resumed run's first round counts only the time of the process that finished it.

From the matrix (`agent_runtime.evaluation.matrix.Matrix`), per family: its largest drop below its best so far at
any round and at the end, and its lowest rate below its base after the phase that first trained it.
"""

from __future__ import annotations

import time

from agent_runtime.evaluation.drift import drift
from agent_runtime.evaluation.matrix import Matrix, load_matrix
from distill.lessons import live_lessons
from distill.lessons.curate import render_lessons
from distill.lessons.scope import in_scope_lessons, scoped_lessons
from memory import ExperienceStore
from memory.rounds import PHASES, FamilyCourse, RoundRecord, family_course, fill_round

__all__ = [
    "PHASES",
    "FamilyCourse",
    "RoundClock",
    "RoundRecord",
    "courses",
    "courses_table",
    "load_rounds",
    "round_fields",
    "round_line",
]


class RoundClock:
    """Wall seconds of each top-level phase since the last round, from the loop's `Profile`; the round's own
    assessment from when it started (`start_assess`) to when its record is taken."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._assess_started: float | None = None

    def start_assess(self) -> None:
        self._assess_started = time.perf_counter()

    def lap(self, profile, memory: dict[str, float]) -> tuple[dict[str, float], float]:
        """(wall seconds per phase this round, the process's peak resident MB over every phase so far); `memory`: the
        process's `state.profile.memory_mb()` now."""
        now = {name: profile.phases[name].wall_s for name in PHASES if name in profile.phases}
        out = {name: now[name] - self._last.get(name, 0.0) for name in now if name != "ASSESS"}
        self._last = now
        if self._assess_started is not None:
            out["ASSESS"] = time.perf_counter() - self._assess_started
        peak = max([row.peak_rss_mb for row in profile.phases.values()] + [memory.get("VmHWM", 0.0)])
        return out, peak


def round_fields(run, backend, adapter, seconds: dict[str, float], rss_mb: float | None, peak_mb: float) -> dict:
    """What a round leaves beside its matrix row (`RoundRecord.stored`): per environment the live lessons in its
    scope (the first pool, as the assessment shows them) and the tokens of their block, the adapter's drift from the
    base model, the round's phase times and the process's memory."""
    _, live = live_lessons(run.store, run.id)
    first = min((x.pool for x in live), default=0)
    scoped = scoped_lessons(x for x in live if x.pool == first)
    count = run.lesson_budget.count_tokens
    lessons = {}
    for entry in run.config.envs:
        texts = [x.text for x in in_scope_lessons(scoped, entry.id, run.families.get(entry.id))]
        lessons[entry.id] = {"count": len(texts), "tokens": count(render_lessons(texts)) if texts else 0}
    record = RoundRecord(0, "", {}, lessons, drift(run, backend, adapter), seconds, rss_mb, peak_mb)
    record.adapter = adapter.name if adapter else None
    return record.stored()


def round_line(store: ExperienceStore, run_id: int, config, index: int) -> tuple[str, dict]:
    """The line a run prints after round `index`'s assessment (its matrix row, lessons, drift, time, memory), and the
    fields its log record keeps."""
    env_ids = [e.id for e in config.envs]
    matrix = load_matrix(store, run_id, config.curriculum, env_ids)
    records = {r.after_phase: r for r in load_rounds(store, run_id, matrix)}
    record = records.get(index) or RoundRecord(index, matrix.phases[index], {e: matrix.rate(index, e) for e in env_ids})
    where = "start" if index == 0 else f"after phase {index} ({matrix.phases[index]})"
    line = f"ASSESS {where}: " + record.line(env_ids).split(": ", 1)[1]
    return line, {"phase": "ASSESS", "after_phase": index, "R": matrix.as_dict()["R"], "round": record.stored()}


def load_rounds(store: ExperienceStore, run_id: int, matrix: Matrix) -> list[RoundRecord]:
    """The run's round records in order (a round assessed before records existed has rates only)."""
    by_round: dict[int, RoundRecord] = {}
    for row in store.evaluations(run_id, kind="eval"):
        mark = (row.metrics or {}).get("continual")
        if not isinstance(mark, dict) or row.env_id not in matrix.envs:
            continue
        index = mark.get("after_phase")
        if not isinstance(index, int) or not 0 <= index < len(matrix.phases):
            continue
        record = by_round.setdefault(
            index, RoundRecord(index, matrix.phases[index], {e: matrix.rate(index, e) for e in matrix.envs})
        )
        stored = mark.get("round")
        if isinstance(stored, dict):
            fill_round(record, stored)
    return [by_round[i] for i in sorted(by_round)]


def courses(matrix: Matrix) -> list[FamilyCourse]:
    return [
        family_course(env, [matrix.rate(i, env) for i in range(matrix.rows)], matrix.learned.get(env))
        for env in matrix.envs
    ]


def courses_table(matrix: Matrix, escape=str) -> str:
    """Each family's base, best, end and drops, one line each."""
    lines = [
        "family                    base   best    end  largest drop below best  at end  lowest vs base after learned"
    ]
    for c in courses(matrix):

        def pct(x):
            return "   -" if x is None else f"{x:5.0%}"

        below = "-" if c.worst_below_base_after_learned is None else f"{c.worst_below_base_after_learned * 100:+.0f}"
        lines.append(
            f"{escape(c.env.rsplit('/', 1)[-1])[:24]:<24} {pct(c.base)}  {pct(c.best)}  {pct(c.end)}"
            f"  {c.largest_drop_below_best * 100:23.0f}  {c.drop_below_best_at_end * 100:6.0f}  {below:>29}"
        )
    return "\n".join(lines)
