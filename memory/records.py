"""Plain dataclasses that cross the store's boundary: what callers write and what reads return.

Why not hand out ORM objects: they are bound to a session, lazy-load on attribute access and change
under the caller's feet. The store's reads return these frozen-in-time copies instead, so a
dashboard thread or the agent loop can keep them as long as it likes.

`EpisodeRecord`/`StepRecord` are filled by the runtime and written with `ExperienceStore.add_episode`;
the `*Info` classes are what reads return (they carry the database ids and derived columns).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, TypeVar

InfoT = TypeVar("InfoT")


@dataclass
class StepRecord:
    """One turn as the runtime saw it; `action` is None when the response could not be parsed."""

    index: int
    observation: str
    prompt: str
    response: str
    action: str | None
    valid_action: bool
    reward: float
    admissible_actions: list[str] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeRecord:
    """One finished episode; `outcome` is one of "won", "lost", "truncated", "error"."""

    env_id: str
    task_id: str
    seed: int | None
    policy: str
    adapter_id: int | None
    lesson_set_version: int | None
    outcome: str
    won: bool
    total_return: float
    prompt_tokens: int
    completion_tokens: int
    started_at: dt.datetime
    ended_at: dt.datetime
    error: str | None = None
    goal: str | None = None
    lessons_in_context: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    # `modelkit.fingerprint` of the LoRA weights the acting backend had loaded (None: base model, or not reported)
    adapter_fingerprint: str | None = None


@dataclass
class StepInfo(StepRecord):
    """A stored step: the record plus its ids."""

    id: int = 0
    episode_id: int = 0


@dataclass
class EpisodeInfo:
    """A stored episode. `steps` is filled only by `ExperienceStore.episode` (lists leave it empty)."""

    id: int
    run_id: int
    env_id: str
    task_id: str
    seed: int | None
    policy: str
    adapter_id: int | None
    lesson_set_version: int | None
    outcome: str
    won: bool
    total_return: float
    num_steps: int
    prompt_tokens: int
    completion_tokens: int
    started_at: dt.datetime
    ended_at: dt.datetime
    error: str | None
    goal: str | None
    summary: str
    lessons_in_context: list[int]
    metadata: dict[str, Any]
    steps: list[StepInfo] = field(default_factory=list)
    adapter_fingerprint: str | None = None

    @property
    def duration_s(self) -> float:
        return (self.ended_at - self.started_at).total_seconds()


@dataclass
class RunInfo:
    """A run: its resolved config and the loop's persisted phase cursor and state."""

    id: int
    name: str
    config: dict[str, Any]
    phase: str
    state: dict[str, Any]
    status: str
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass
class LessonInfo:
    """A stored lesson with its provenance and usage statistics."""

    id: int
    run_id: int | None
    text: str
    status: str
    pool: int
    env_id: str | None
    source_episode_ids: list[int]
    extraction_id: int | None
    consolidated_cycle_id: int | None
    token_count: int
    times_in_context: int
    wins_in_context: int
    created_at: dt.datetime
    updated_at: dt.datetime
    metadata: dict[str, Any]
    forgotten_at: dt.datetime | None = None
    scope: list[str] = dataclasses.field(default_factory=lambda: ["*"])  # see `distill.lessons.scope`


@dataclass
class RequestInfo:
    """A request to a run (see `memory.models.RunRequest`); pending while `done_at` is None."""

    id: int
    run_id: int
    kind: str
    payload: dict[str, Any]
    created_at: dt.datetime
    done_at: dt.datetime | None
    outcome: dict[str, Any]


@dataclass
class LessonSetInfo:
    """One lesson-set version: its number within the run, the ordered lesson ids it holds, whether it
    is live or a candidate (`status`) and who made it (`made_by`: "agent" or "user")."""

    id: int
    run_id: int | None
    version: int
    lesson_ids: list[int]
    status: str
    made_by: str
    token_count: int
    note: str
    created_at: dt.datetime


@dataclass
class ExtractionInfo:
    id: int
    run_id: int | None
    extractor: str
    episode_ids: list[int]
    prompt: str
    response: str
    created_at: dt.datetime
    metadata: dict[str, Any]


@dataclass
class CycleInfo:
    """One OPCD cycle; `curves` maps a metric name to its per-step values; `episode_ids` are the episodes its
    training prompts came from (its adapter's training set)."""

    id: int
    run_id: int | None
    status: str
    config: dict[str, Any]
    lesson_set_version: int | None
    base_adapter_id: int | None
    adapter_id: int | None
    metrics: dict[str, Any]
    curves: dict[str, Any]
    error: str | None
    started_at: dt.datetime
    ended_at: dt.datetime | None
    episode_ids: list[int] = field(default_factory=list)


@dataclass
class AdapterInfo:
    id: int
    run_id: int | None
    name: str
    path: str
    parent_id: int | None
    base_model: str | None
    status: str
    created_at: dt.datetime
    metadata: dict[str, Any]
    fingerprint: str | None = None  # `modelkit.fingerprint` of the files the trainer wrote


@dataclass
class EvaluationInfo:
    """One evaluation row; `kind` says what it holds ("eval", "gate" or "lesson-utility")."""

    id: int
    kind: str
    run_id: int | None
    adapter_id: int | None
    cycle_id: int | None
    lesson_set_version: int | None
    env_id: str
    split: str
    policy: str
    num_episodes: int
    success_rate: float | None
    mean_return: float | None
    metrics: dict[str, Any]
    created_at: dt.datetime


@dataclass
class SearchHit:
    """One retrieval result: the item id, its cosine similarity to the query, and the item itself."""

    id: int
    score: float
    item: Any


def to_info(cls: type[InfoT], row: Any) -> InfoT:
    """Copy an ORM row into the dataclass `cls` (a `meta` attribute becomes the `metadata` field;
    fields the row lacks, like an episode's `steps`, keep their defaults)."""
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == "metadata":
            values["metadata"] = row.meta
        elif hasattr(row, f.name):
            values[f.name] = getattr(row, f.name)
    return cls(**values)
