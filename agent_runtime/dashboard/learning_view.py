"""The learning page's reads: does the agent get better over a run, and did each OPCD cycle work?

What:
- `learning_chart(store, run_id, window=20)`: the run's rolling success rate over its last `window`
  episodes (in the order the run played them) with its 95% Wilson interval as a band, marked where a
  lesson-set version went live and where an adapter went live.
- `live_marks(store, run_id)`: those marks alone (the page lists them under the chart).
- `evaluation_matrix(store, run_id)`: one row per OPCD cycle (status, held-out KL before -> after) and
  one column per evaluated condition; each cell a success rate with its 95% interval and n.
- `headline(matrix)`: the newest evaluated cycle's base vs with lessons vs consolidated.

Why this way: a run can hold 100k episodes, so the curve is computed in SQL with window functions (SQLite and PostgreSQL
both have them) and only the sampled points (at most `reads.MAX_POINTS`) and the first episodes the marks need leave the
database; no episode's content is read. A version or adapter "goes live" with the first episode played with it: that is
when it starts to count for success, while a version's creation time can come long before any episode uses it (or it may
never be used). The evaluation rows are what `agent_runtime.phases.consolidate` stores: one per environment and
condition, `metrics["condition"]` naming the condition and `metrics["ci95"]` its interval. A cell pools its condition's
rows across environments; a single row keeps its stored interval. Conditions the dashboard does not know become extra
columns (after the known ones, in the order first seen), never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, Row, Subquery, func, select, union
from sqlalchemy.orm import Session

from agent_runtime.dashboard.reads import (
    Chart,
    finite,
    read_session,
    sample_stride,
)
from memory import EVALUATION_EVAL, ExperienceStore
from memory.conditions import condition_labels
from memory.intervals import wilson_interval
from memory.models import Adapter, Cycle, Episode, Evaluation

# The headline: what the agent could do before the cycle, with lessons in context, and after it without.
HEADLINE = (
    ("base", "teacher_without_lessons"),
    ("with lessons", "teacher_with_lessons"),
    ("consolidated", "student_without_lessons"),
)


def condition_key(name: str) -> str:
    """One key per condition however it is spelt: "Student without-lessons" -> "student_without_lessons"."""
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def condition_label(name: str, split: str = "validation") -> str:
    """A condition as the dashboard shows it: the known ones by their label (`memory.conditions`), others as
    stored."""
    return condition_labels(split=split).get(condition_key(name), str(name))


@dataclass
class Rate:
    """A success rate over n episodes with its 95% interval."""

    successes: float
    n: int
    low: float
    high: float

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n else None

    def as_json(self) -> dict[str, Any]:
        return {"rate": self.rate, "low": self.low, "high": self.high, "n": self.n}


def _stored_interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, list | tuple) and len(value) == 2:
        low, high = finite(value[0]), finite(value[1])
        if low is not None and high is not None and low <= high:
            return low, high
    return None


def pooled_rate(rows: list[tuple[int, float, Any]]) -> Rate:
    """(n, success rate, stored ci95) rows of one condition -> one rate: a single row keeps its stored
    interval, several (one per environment) are pooled and get the Wilson interval of the pool."""
    n = sum(count for count, _, _ in rows)
    successes = sum(count * rate for count, rate, _ in rows)
    stored = _stored_interval(rows[0][2]) if len(rows) == 1 else None
    low, high = stored or wilson_interval(successes, n)
    return Rate(successes, n, low, high)


# -- the curve ---------------------------------------------------------------------------------


def _numbered(run_id: int, window: int | None = None) -> Subquery:
    """SQL: the run's episodes in order, each with its ordinal `x` (1-based, by id, as the overview's
    charts), its lesson-set version and adapter, and given a window the `wins` and `n` over the last
    `window` episodes up to it."""
    columns = [
        Episode.id.label("episode_id"),
        Episode.lesson_set_version.label("version"),
        Episode.adapter_id.label("adapter_id"),
        func.row_number().over(order_by=Episode.id).label("x"),
    ]
    if window is not None:
        frame = (-(window - 1), 0)
        columns += [
            func.sum(Episode.won.cast(Integer)).over(order_by=Episode.id, rows=frame).label("wins"),
            func.count(Episode.id).over(order_by=Episode.id, rows=frame).label("n"),
        ]
    return select(*columns).where(Episode.run_id == run_id).subquery()


def _first_episode_ids(run_id: int) -> Any:
    """SQL: the ids of the run's first episode with each lesson-set version and with each adapter
    (grouped minima: no window, no ordering of the whole run)."""
    in_run = Episode.run_id == run_id
    return union(
        select(func.min(Episode.id))
        .where(in_run, Episode.lesson_set_version.is_not(None))
        .group_by(Episode.lesson_set_version),
        select(func.min(Episode.id)).where(in_run, Episode.adapter_id.is_not(None)).group_by(Episode.adapter_id),
    )


def _marks(session: Session, rows: list[Row[Any]]) -> list[dict[str, Any]]:
    """The live marks from rows of `_numbered` in order that include every first episode: the first row
    with a version (adapter) is its first episode, since that episode is among the rows and no row
    before it has that version (adapter)."""
    marks: list[dict[str, Any]] = []
    versions: set[int] = set()
    adapters: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row.version is not None and row.version not in versions:
            versions.add(row.version)
            marks.append(
                {
                    "x": int(row.x),
                    "label": f"lessons v{row.version}",
                    "kind": "lesson_set",
                    "version": int(row.version),
                    "episode_id": int(row.episode_id),
                }
            )
        if row.adapter_id is not None and row.adapter_id not in adapters:
            adapters[row.adapter_id] = {
                "x": int(row.x),
                "label": "",
                "kind": "adapter",
                "adapter_id": int(row.adapter_id),
                "episode_id": int(row.episode_id),
            }
            marks.append(adapters[row.adapter_id])
    if adapters:
        names = dict(session.execute(select(Adapter.id, Adapter.name).where(Adapter.id.in_(adapters))).all())
        for adapter_id, mark in adapters.items():
            name = str(names.get(adapter_id, f"#{adapter_id}"))
            mark["label"] = name if name.lower().startswith("adapter") else f"adapter {name}"
    return sorted(marks, key=lambda m: (m["x"], m["kind"]))


def live_marks(store: ExperienceStore, run_id: int) -> list[dict[str, Any]]:
    """Where lesson-set versions and adapters went live in the run: {"x": the first episode's ordinal
    in the run (1-based), "label", "kind": "lesson_set" | "adapter", "episode_id", and "version" or
    "adapter_id"}, in the order they went live."""
    numbered = _numbered(run_id)
    with read_session(store) as session:
        rows = session.execute(
            select(numbered).where(numbered.c.episode_id.in_(_first_episode_ids(run_id))).order_by(numbered.c.x)
        ).all()
        return _marks(session, list(rows))


def learning_chart(store: ExperienceStore, run_id: int, *, window: int = 20) -> Chart:
    """The run's rolling success rate with its 95% Wilson band and the live marks.

    x is the episode's ordinal in the run (by id, as the overview's charts); the rate at x is over
    episodes x-window+1..x (fewer at the start, where the band is wide accordingly). One pass in SQL
    returns the sampled points (every stride-th and the last, at most `reads.MAX_POINTS`) and the
    first episodes that the marks need.
    """
    assert window >= 1, f"window must be at least 1, got {window}"
    numbered = _numbered(run_id, window)
    with read_session(store) as session:
        total = int(session.scalar(select(func.count(Episode.id)).where(Episode.run_id == run_id)) or 0)
        stride = sample_stride(total)
        rows = session.execute(
            select(numbered)
            .where(
                (numbered.c.x % stride == 0)
                | (numbered.c.x == total)
                | numbered.c.episode_id.in_(_first_episode_ids(run_id))
            )
            .order_by(numbered.c.x)
        ).all()
        marks = _marks(session, list(rows))
    chart = Chart(
        f"rolling success rate (last {window} episodes), 95% Wilson band",
        "episode",
        "success",
        y_range=(0.0, 1.0),
        marks=marks,
        bands=[("95% high", "95% low")],
    )
    rates: list[float | None] = []
    highs: list[float | None] = []
    lows: list[float | None] = []
    for row in rows:
        if row.x % stride and row.x != total:
            continue  # only here for a mark
        wins, n = int(row.wins or 0), int(row.n)
        low, high = wilson_interval(wins, n)
        chart.x.append(int(row.x))
        rates.append(wins / n)
        highs.append(high)
        lows.append(low)
    chart.series = {f"success (last {window})": rates, "95% high": highs, "95% low": lows}
    if not total:
        chart.note = "no episodes yet"
    return chart


# -- the evaluation matrix ---------------------------------------------------------------------


@dataclass
class CycleRow:
    """One OPCD cycle in the matrix: its outcome, its held-out KL, and a rate per condition key."""

    cycle_id: int
    status: str
    kl_before: float | None
    kl_after: float | None
    cells: dict[str, Rate] = field(default_factory=dict)


@dataclass
class Matrix:
    """Cycles (oldest first) by conditions (known ones first, then others as first seen)."""

    columns: list[tuple[str, str]]  # (key, label)
    rows: list[CycleRow]

    def as_json(self) -> dict[str, Any]:
        return {
            "columns": [{"key": k, "label": label} for k, label in self.columns],
            "rows": [
                {
                    "cycle_id": r.cycle_id,
                    "status": r.status,
                    "heldout_kl": {"before": r.kl_before, "after": r.kl_after},
                    "cells": {k: c.as_json() for k, c in r.cells.items()},
                }
                for r in self.rows
            ],
        }


def evaluation_matrix(store: ExperienceStore, run_id: int) -> Matrix:
    """Every OPCD cycle of the run with its evaluations per condition (only rows of kind "eval": the
    gate's and the lesson utilities' rows are not cycle evaluations). Only the needed JSON fields are read:
    an evaluation's metrics also hold every evaluation episode."""
    condition = Evaluation.metrics["condition"].as_string()
    with read_session(store) as session:
        cycles = session.execute(
            select(Cycle.id, Cycle.status, Cycle.metrics["heldout_kl"]).where(Cycle.run_id == run_id).order_by(Cycle.id)
        ).all()
        evaluations = session.execute(
            select(
                Evaluation.cycle_id,
                condition,
                Evaluation.policy,
                Evaluation.num_episodes,
                Evaluation.success_rate,
                Evaluation.metrics["ci95"],
                Evaluation.split,
            )
            .join(Cycle, Cycle.id == Evaluation.cycle_id)
            .where(Cycle.run_id == run_id, Evaluation.kind == EVALUATION_EVAL)
            .order_by(Evaluation.id)
        ).all()
    grouped: dict[int, dict[str, list[tuple[int, float, Any]]]] = {}
    unknown: dict[str, str] = {}
    splits = {str(split) for _, named, _, _, _, _, split in evaluations if split and "validation" in str(named or "")}
    # the promotion's decision games: the fold its rows were played on (a run before folds decided on train games)
    known = condition_labels(split="/".join(sorted(splits)) or "validation")
    for cycle_id, named, policy, n, rate, ci95, _ in evaluations:
        name = str(named) if named not in (None, "") else policy
        key = condition_key(name)
        if key not in known:
            unknown.setdefault(key, str(name))
        if finite(rate) is not None:
            grouped.setdefault(cycle_id, {}).setdefault(key, []).append((int(n or 0), float(rate), ci95))
    seen = {k for per_cycle in grouped.values() for k in per_cycle}
    columns = [(k, label) for k, label in known.items() if k in seen] + list(unknown.items())
    rows = []
    for cycle_id, status, kl in cycles:
        kl = kl if isinstance(kl, dict) else {}
        cells = {k: pooled_rate(v) for k, v in grouped.get(cycle_id, {}).items()}
        rows.append(CycleRow(cycle_id, status, finite(kl.get("before")), finite(kl.get("after")), cells))
    return Matrix(columns, rows)


@dataclass
class Headline:
    """The newest evaluated cycle's base, with-lessons and consolidated rates (None: not evaluated)."""

    cycle_id: int
    status: str
    rates: list[tuple[str, str, Rate | None]]  # (label, condition key, rate)

    def as_json(self) -> dict[str, Any]:
        return {
            "cycle_id": self.cycle_id,
            "status": self.status,
            "rates": {label: (r.as_json() if r else None) for label, _, r in self.rates},
        }


def headline(matrix: Matrix) -> Headline | None:
    """From the newest cycle that has at least one of the headline's conditions evaluated; None if none."""
    for row in reversed(matrix.rows):
        if any(key in row.cells for _, key in HEADLINE):
            return Headline(row.cycle_id, row.status, [(label, key, row.cells.get(key)) for label, key in HEADLINE])
    return None
