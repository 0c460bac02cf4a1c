"""The dashboard's reads that `ExperienceStore` does not offer, as read-only SQL over `memory.models`.

What: paged and filtered episode lists (task, adapter, lesson-set version), an episode's steps a page at a time
(an episode of huge observations stays a small page), per-run counts, the
success-rate series behind the overview charts, a lesson's provenance in both directions (the lessons
an episode produced, the lesson-set versions that held a lesson), lesson-set diffs, adapter lineage,
OPCD curves normalised for plotting, a step's choice distribution, and which embedder made the stored
vectors (every success rate is shown with `memory.intervals.wilson_interval`). The views'
reads (`learning_view.py`, `lifecycle.py`) build on these.

Why here and not in `memory`: these are views for one screen, not part of the memory's contract; they
use only the store's engine, which the dashboard opens read-only at the driver, so nothing here can
write. Everything returns plain values or `memory.records` dataclasses.

Chart data has one shape everywhere (`Chart`): a shared x axis, named series aligned to it (None where
a series has no value yet), optional vertical marks (cycle boundaries, lesson sets and adapters going
live) and bands (an interval shaded between two of the series). `static/dashboard.js` draws it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, Row, Select, Text, cast, func, select
from sqlalchemy.orm import Session

from memory import (
    EVALUATION_GATE,
    EpisodeInfo,
    ExperienceStore,
    LessonInfo,
    LessonSetInfo,
    NotFoundError,
)
from memory.models import Adapter, Cycle, Embedding, Episode, Lesson, LessonSet, LessonSetMember, Step
from memory.records import AdapterInfo, CycleInfo, EvaluationInfo, StepInfo, to_info

MAX_POINTS = 400
MAX_INT = 2**31 - 1  # ids are 32-bit integers in PostgreSQL; larger values overflow SQLite's binding


@contextmanager
def read_session(store: ExperienceStore) -> Iterator[Session]:
    """One transaction over the store's engine (read-only at the driver: see `create_app`)."""
    with Session(store.engine) as session, session.begin():
        yield session


@dataclass
class EpisodeFilter:
    """The episode table's filters; None means "any"."""

    run_id: int | None = None
    env_id: str | None = None
    task: str | None = None
    outcome: str | None = None
    adapter_id: int | None = None
    lesson_set_version: int | None = None

    def apply(self, query: Select[Any]) -> Select[Any]:
        if self.run_id is not None:
            query = query.where(Episode.run_id == self.run_id)
        if self.env_id:
            query = query.where(Episode.env_id == self.env_id)
        if self.task:
            query = query.where(Episode.task_id.contains(self.task, autoescape=True))
        if self.outcome:
            query = query.where(Episode.outcome == self.outcome)
        if self.adapter_id is not None:
            query = query.where(Episode.adapter_id == self.adapter_id)
        if self.lesson_set_version is not None:
            query = query.where(Episode.lesson_set_version == self.lesson_set_version)
        return query


def episode_page(
    store: ExperienceStore, where: EpisodeFilter, *, page: int, per_page: int
) -> tuple[list[EpisodeInfo], int]:
    """One page (1-based) of matching episodes, newest first, and the number of matches."""
    with read_session(store) as session:
        total = int(session.scalar(where.apply(select(func.count(Episode.id)))) or 0)
        rows = session.scalars(
            where.apply(select(Episode)).order_by(Episode.id.desc()).limit(per_page).offset((page - 1) * per_page)
        )
        return [to_info(EpisodeInfo, r) for r in rows], total


def episode_head(store: ExperienceStore, episode_id: int) -> EpisodeInfo:
    """One episode without its steps (`episode_steps` reads them a page at a time)."""
    with read_session(store) as session:
        row = session.get(Episode, episode_id)
        if row is None:
            raise NotFoundError(f"no episode with id {episode_id} in {store.url}")
        return to_info(EpisodeInfo, row)


def episode_steps(store: ExperienceStore, episode_id: int, *, offset: int, limit: int) -> tuple[list[StepInfo], int]:
    """`limit` steps of an episode from the `offset`-th, in order, and how many it has. Their `prompt` is left empty:
    the page loads a prompt when it is opened (`step_prompt`)."""
    where = Step.episode_id == episode_id
    with read_session(store) as session:
        total = int(session.scalar(select(func.count(Step.id)).where(where)) or 0)
        rows = session.scalars(select(Step).where(where).order_by(Step.index).limit(limit).offset(offset))
        steps = [to_info(StepInfo, row) for row in rows]
    for step in steps:
        step.prompt = ""
    return steps, total


def step_text(store: ExperienceStore, episode_id: int, index: int, name: str) -> str | None:
    """One stored text of a step, whole (`name`: a column of `steps`, checked by the caller)."""
    with read_session(store) as session:
        text = session.execute(
            select(getattr(Step, name)).where(Step.episode_id == episode_id, Step.index == index)
        ).one_or_none()
    if text is None:
        raise NotFoundError(f"episode {episode_id} has no step {index} in {store.url}")
    return text[0]


def step_rewards(store: ExperienceStore, episode_id: int) -> list[tuple[int, float]]:
    """(step index, reward) of every step of an episode, in order: the reward chart reads nothing else."""
    with read_session(store) as session:
        rows = session.execute(
            select(Step.index, Step.reward).where(Step.episode_id == episode_id).order_by(Step.index)
        )
        return [(int(index), reward) for index, reward in rows]


def step_prompt(store: ExperienceStore, episode_id: int, index: int) -> str:
    """The full prompt of one step (the episode page loads prompts only when opened: they are long; the
    store rebuilds it from its stored recipe)."""
    return store.step_prompt(episode_id, index)


@dataclass
class ChoiceOption:
    """One admissible action of a step played in choice mode, with the probability the policy gave it."""

    action: str
    probability: float | None  # None when the stored log-probability is not a finite number
    chosen: bool


@dataclass
class ChoiceDistribution:
    """What a choice-mode step's `info` says about the policy's distribution over admissible actions."""

    options: list[ChoiceOption]
    problem: str = ""  # why the distribution cannot be shown, when it cannot

    @property
    def total(self) -> float:
        return sum(o.probability or 0.0 for o in self.options)


def choice_distribution(step: StepInfo) -> ChoiceDistribution | None:
    """The step's distribution over its admissible actions, when it was played in choice mode.

    A choice-mode step stores `info["action_mode"] == "choice"` and `info["choice_logprobs"]`, one
    log-probability per admissible action, in the same order. None for any other step.
    """
    info = step.info or {}
    if info.get("action_mode") != "choice" or "choice_logprobs" not in info:
        return None
    logprobs = info["choice_logprobs"]
    actions = step.admissible_actions or []
    if not isinstance(logprobs, list) or len(logprobs) != len(actions):
        count = len(logprobs) if isinstance(logprobs, list) else type(logprobs).__name__
        return ChoiceDistribution([], f"choice_logprobs holds {count} values for {len(actions)} admissible actions")
    options = []
    for action, logprob in zip(actions, logprobs, strict=True):
        value = finite(logprob)
        # a log-probability is at most 0; allow rounding noise above it
        probability = min(1.0, math.exp(value)) if value is not None and value <= 1e-6 else None
        options.append(ChoiceOption(str(action), probability, action == step.action))
    return ChoiceDistribution(options)


def env_ids(store: ExperienceStore, run_id: int | None = None) -> list[str]:
    """The environments that have episodes (in the run, if given), sorted."""
    query = select(Episode.env_id).distinct().order_by(Episode.env_id)
    if run_id is not None:
        query = query.where(Episode.run_id == run_id)
    with read_session(store) as session:
        return list(session.scalars(query))


def run_counts(store: ExperienceStore) -> dict[int, tuple[int, int]]:
    """Per run id: (episodes, episodes won)."""
    query = select(Episode.run_id, func.count(Episode.id), func.sum(Episode.won.cast(Integer)))
    with read_session(store) as session:
        return {rid: (int(n), int(w or 0)) for rid, n, w in session.execute(query.group_by(Episode.run_id))}


def lessons_from_episode(store: ExperienceStore, episode: EpisodeInfo) -> list[LessonInfo]:
    """The lessons whose provenance names this episode, of the episode's run or of none (an index
    lookup: opening an episode never reads the run's other lessons)."""
    return store.lessons_from_episode(episode.id, run_id=episode.run_id)


def versions_holding(store: ExperienceStore, lesson_id: int) -> list[int]:
    """The lesson-set version numbers that contain the lesson, ascending."""
    with read_session(store) as session:
        return list(
            session.scalars(
                select(LessonSet.version)
                .join(LessonSetMember, LessonSetMember.lesson_set_id == LessonSet.id)
                .where(LessonSetMember.lesson_id == lesson_id)
                .order_by(LessonSet.version)
            )
        )


@dataclass
class VersionDiff:
    """A lesson-set version and what changed against the version before it."""

    version: LessonSetInfo
    added: list[int]
    removed: list[int]


def version_diffs(store: ExperienceStore, run_id: int | None) -> list[VersionDiff]:
    """Every lesson-set version of the run, newest first, each with its diff to the previous one."""
    diffs = []
    previous: set[int] = set()
    for version in store.lesson_sets(run_id):
        current = set(version.lesson_ids)
        diffs.append(
            VersionDiff(
                version,
                added=[i for i in version.lesson_ids if i not in previous],
                removed=sorted(previous - current),
            )
        )
        previous = current
    return diffs[::-1]


def adapter_lineage(store: ExperienceStore, adapter_id: int) -> list[AdapterInfo]:
    """The adapter and its ancestors, newest first (stops at a missing parent or a cycle in the chain)."""
    chain: list[AdapterInfo] = []
    seen: set[int] = set()
    current: int | None = adapter_id
    with read_session(store) as session:
        while current is not None and current not in seen:
            row = session.get(Adapter, current)
            if row is None:
                break
            seen.add(current)
            chain.append(to_info(AdapterInfo, row))
            current = row.parent_id
    return chain


def _with_lessons() -> Any:
    """SQL: the episode had lessons in context. JSON lists are stored as JSON text ('[]' when empty,
    on SQLite and PostgreSQL alike), so comparing the text avoids decoding every list in Python."""
    return cast(Episode.lessons_in_context, Text) != "[]"


def success_without_lessons(store: ExperienceStore, run_id: int) -> float | None:
    """The run's success rate over episodes played with no lessons in context (the lessons' baseline)."""
    with read_session(store) as session:
        n, won = session.execute(
            select(func.count(Episode.id), func.sum(Episode.won.cast(Integer))).where(
                Episode.run_id == run_id, ~_with_lessons()
            )
        ).one()
    return int(won or 0) / n if n else None


def lessons_consolidated_by(store: ExperienceStore, cycle_id: int) -> list[int]:
    with read_session(store) as session:
        return list(
            session.scalars(select(Lesson.id).where(Lesson.consolidated_cycle_id == cycle_id).order_by(Lesson.id))
        )


def gate_decisions(store: ExperienceStore, run_id: int | None) -> dict[int, EvaluationInfo]:
    """Lesson-set version -> the newest validation-gate decision about it."""
    return {
        e.lesson_set_version: e
        for e in store.evaluations(run_id, kind=EVALUATION_GATE)
        if e.lesson_set_version is not None
    }


@dataclass
class Decision:
    """What became of a cycle's adapter, and why (from its status, metrics and error)."""

    outcome: str
    reasons: list[str]


DECISIONS = {
    "promoted": "promoted: the adapter became the active one",
    "rolled_back": "rolled back: the adapter was rejected",
    "running": "pending: the cycle is still running",
    "succeeded": "pending: trained, not yet promoted or rolled back",
    "failed": "failed: the cycle did not finish",
}


def decision(cycle: CycleInfo) -> Decision:
    """The promotion decision as the loop recorded it: `metrics["decision"]` (a sentence) and
    `metrics["reasons"]` (a list of sentences or one), else derived from the status; plus the error."""
    metrics = cycle.metrics or {}
    outcome = str(metrics.get("decision") or DECISIONS.get(cycle.status, cycle.status))
    raw = metrics.get("reasons") or []
    reasons = [str(r) for r in raw] if isinstance(raw, list) else [str(raw)]
    if cycle.error:
        reasons.append(f"error: {cycle.error}")
    return Decision(outcome, reasons)


# -- charts ------------------------------------------------------------------------------------


@dataclass
class Chart:
    """One plot: x values, aligned named series, vertical marks. Serialised with `as_json`."""

    title: str
    x_label: str
    y_label: str
    x: list[float] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)
    marks: list[dict[str, Any]] = field(default_factory=list)
    y_range: tuple[float, float] | None = None
    note: str = ""
    bands: list[tuple[str, str]] = field(default_factory=list)  # (upper, lower) series labels to shade between

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "x_label": self.x_label,
            "y_label": self.y_label,
            "x": self.x,
            "series": [{"label": k, "values": v} for k, v in self.series.items()],
            "marks": self.marks,
            "y_range": list(self.y_range) if self.y_range else None,
            "note": self.note,
            "bands": [{"upper": upper, "lower": lower} for upper, lower in self.bands],
        }


def finite(value: Any) -> float | None:
    """The value as a float, or None when it is not a finite number (NaN, infinity, text, None)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def sample_stride(n: int) -> int:
    """Keep every stride-th of `n` points (and the last) so that a chart has at most MAX_POINTS."""
    return max(1, math.ceil(n / MAX_POINTS))


def _last_rates(session: Session, run_id: int, key: Any, window: int, stride: int) -> list[Row[Any]]:
    """SQL: per group (`key`: the environment, or whether lessons were in context) and per bucket of
    `stride` episodes (by ordinal in the run), the group's rolling (wins, n) over its last `window`
    episodes as of its last episode in the bucket. At most buckets x groups rows leave the database."""
    frame = (-(window - 1), 0)
    numbered = (
        select(
            key.label("key"),
            func.row_number().over(order_by=Episode.id).label("x"),
            func.sum(Episode.won.cast(Integer)).over(partition_by=key, order_by=Episode.id, rows=frame).label("wins"),
            func.count(Episode.id).over(partition_by=key, order_by=Episode.id, rows=frame).label("n"),
        )
        .where(Episode.run_id == run_id)
        .subquery()
    )
    bucket = ((numbered.c.x + (stride - 1)) // stride).label("bucket")  # integer division (of integers)
    ranked = select(
        numbered,
        bucket,
        func.row_number().over(partition_by=[numbered.c.key, bucket], order_by=numbered.c.x.desc()).label("last"),
    ).subquery()
    return list(
        session.execute(
            select(ranked.c.key, ranked.c.bucket, ranked.c.wins, ranked.c.n)
            .where(ranked.c.last == 1)
            .order_by(ranked.c.bucket, ranked.c.x)
        )
    )


def _cycle_marks(session: Session, run_id: int) -> list[dict[str, Any]]:
    """The run's OPCD cycles as marks at the number of the run's episodes that had ended when the cycle
    ended (or started, while running). One range count per cycle between consecutive boundaries, on the
    (run_id, ended_at) index: the whole run is counted once, whatever the number of cycles."""
    cycles = session.execute(
        select(Cycle.id, Cycle.status, func.coalesce(Cycle.ended_at, Cycle.started_at).label("at"))
        .where(Cycle.run_id == run_id)
        .order_by(Cycle.id)
    ).all()
    positions: dict[int, int] = {}
    counted, previous = 0, None
    for cycle_id, _, at in sorted(cycles, key=lambda c: (c.at, c.id)):
        in_run = [Episode.run_id == run_id, Episode.ended_at <= at]
        if previous is not None:
            in_run.append(Episode.ended_at > previous)
        counted += int(session.scalar(select(func.count()).select_from(Episode).where(*in_run)) or 0)
        positions[cycle_id], previous = counted, at
    return [{"x": positions[c.id], "label": f"cycle {c.id} {c.status}", "status": c.status} for c in cycles]


def success_charts(store: ExperienceStore, run_id: int, *, window: int = 20) -> list[Chart]:
    """The overview's two charts for a run: rolling success rate per environment, and with lessons
    in context against without; both with the run's OPCD cycle boundaries marked.

    x is the episode's ordinal in the run; each series is the success rate over its last `window`
    episodes, carried forward between its own episodes; at most MAX_POINTS points are kept (every
    stride-th episode and the last). The rates are computed in SQL (window functions, as
    `learning.learning_chart`): the chart is polled every few seconds, and a run holds many episodes.
    """
    assert window >= 1, f"window must be at least 1, got {window}"
    flag = _with_lessons()
    with read_session(store) as session:
        n = int(session.scalar(select(func.count(Episode.id)).where(Episode.run_id == run_id)) or 0)
        stride = sample_stride(n)
        by_env = _last_rates(session, run_id, Episode.env_id, window, stride) if n else []
        by_lessons = _last_rates(session, run_id, flag, window, stride) if n else []
        marks = _cycle_marks(session, run_id)
    per_env = Chart(
        f"success rate per environment (last {window} episodes)", "episode", "success", y_range=(0.0, 1.0), marks=marks
    )
    lessons = Chart(
        f"with lessons in context vs without (last {window} episodes)",
        "episode",
        "success",
        y_range=(0.0, 1.0),
        marks=marks,
    )
    for chart, rows, name in (
        (per_env, by_env, str),
        (lessons, by_lessons, lambda k: "with lessons" if k else "without lessons"),
    ):
        _carry_forward(chart, rows, name, stride, n)
        if not n:
            chart.note = "no episodes yet"
    return [per_env, lessons]


def _carry_forward(chart: Chart, rows: list[Row[Any]], name: Any, stride: int, n: int) -> None:
    """Fill `chart` from `_last_rates` rows: one point per bucket (x = its last ordinal), each group's
    newest rate so far, None before the group's first episode."""
    current: dict[str, float] = {}
    buckets = -(-n // stride)
    by_bucket: dict[int, list[Row[Any]]] = {}
    for row in rows:
        by_bucket.setdefault(int(row.bucket), []).append(row)
    for b in range(1, buckets + 1):
        for row in by_bucket.get(b, []):
            current[name(row.key)] = int(row.wins or 0) / int(row.n)
        chart.x.append(min(b * stride, n))
        for key, rate in current.items():
            chart.series.setdefault(key, [None] * (len(chart.x) - 1)).append(rate)
        for values in chart.series.values():
            if len(values) < len(chart.x):
                values.append(None)


def episode_chart(steps: list[tuple[int, float]]) -> Chart:
    """Per-step reward and cumulative return of one episode, from its (step index, reward) pairs."""
    chart = Chart("reward per step", "step", "reward")
    total = 0.0
    rewards: list[float | None] = []
    returns: list[float | None] = []
    for index, value in steps:
        reward = finite(value) or 0.0
        total += reward
        chart.x.append(index)
        rewards.append(reward)
        returns.append(total)
    chart.series = {"reward": rewards, "return so far": returns}
    if not steps:
        chart.note = "no steps"
    return chart


def _curve_points(values: Any) -> tuple[list[float], list[float | None]] | None:
    """(x, y) from a list of numbers, a list of [x, y] pairs, or {"x"|"step": [...], "y"|"value": [...]}."""
    if isinstance(values, dict):
        xs = values.get("x", values.get("step"))
        ys = values.get("y", values.get("value"))
        if isinstance(xs, list) and isinstance(ys, list) and len(xs) == len(ys):
            return [finite(x) or 0.0 for x in xs], [finite(y) for y in ys]
        return None
    if not isinstance(values, list) or not values:
        return None
    if all(isinstance(v, list | tuple) and len(v) == 2 for v in values):
        return [finite(x) or 0.0 for x, _ in values], [finite(y) for _, y in values]
    if all(isinstance(v, int | float) or v is None for v in values):
        return [float(i) for i in range(len(values))], [finite(v) for v in values]
    return None


def _from_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step metric dicts (a trainer's history) -> {metric: [[step, value], ...]} for numeric metrics."""
    out: dict[str, Any] = {}
    for i, record in enumerate(records):
        step = record.get("step", i)
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                out.setdefault(key, []).append([step, value])
    return out


def curve_charts(curves: dict[str, Any]) -> tuple[list[Chart], list[str]]:
    """One chart per plottable OPCD curve (loss, KL, ...), and the names of curves it could not plot.

    A curve is a list of numbers (one per step), a list of [step, value] pairs, {"step": [...],
    "value": [...]}, or a list of per-step metric dicts (a trainer's history), which becomes one
    chart per numeric metric. Non-finite values are gaps.
    """
    flat: dict[str, Any] = {}
    for name, values in curves.items():
        if isinstance(values, list) and values and all(isinstance(v, dict) for v in values):
            flat.update({f"{name}.{k}" if len(curves) > 1 else k: v for k, v in _from_records(values).items()})
        else:
            flat[name] = values
    charts, skipped = [], []
    for name in sorted(flat):
        points = _curve_points(flat[name])
        if points is None or all(y is None for y in points[1]):
            skipped.append(name)
            continue
        xs, ys = points
        charts.append(Chart(name, "step", name, x=xs, series={name: ys}))
    return charts, skipped


# -- search ------------------------------------------------------------------------------------

_HASH_NAME = re.compile(r"^hash[-:](\d+)$")  # what HashEmbedder calls itself, or its spec
MINILM_NAME = "all-MiniLM-L6-v2"


def stored_embedder(store: ExperienceStore) -> str | None:
    """The name of the embedder that made most stored vectors, or None when there are none."""
    with read_session(store) as session:
        row = session.execute(
            select(Embedding.model, func.count(Embedding.id))
            .group_by(Embedding.model)
            .order_by(func.count(Embedding.id).desc())
            .limit(1)
        ).first()
    return row[0] if row else None


def embedder_spec(name: str) -> str | None:
    """The `memory.embeddings.make_embedder` spec that rebuilds the embedder called `name`, if known
    (whether it can be built -- a hashing embedder's size is bounded -- is `make_embedder`'s to say)."""
    if name == MINILM_NAME:
        return "minilm"
    match = _HASH_NAME.match(name)
    return f"hash:{match.group(1)}" if match else None
