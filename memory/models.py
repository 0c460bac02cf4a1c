"""The experience memory's SQL schema, as typed SQLAlchemy 2 ORM classes.

What: one class per table -- runs, episodes, steps, lessons, lesson-set versions (and their members),
extractions, OPCD cycles, adapters, evaluations, and the embedding vectors that the FAISS indexes cache.

Why this shape:
- Every table has an integer surrogate key, so rows can be exported and re-imported with the same ids
  (the JSONL round trip is exact) and referenced from JSON lists (an episode's `lessons_in_context`,
  a lesson's `source_episode_ids`) without join tables on the hot path.
- Lesson-set membership is a real join table with foreign keys: which lessons were in context is
  provenance we must never lose, so the database itself guards it.
- Timestamps are stored as UTC and always come back timezone-aware (`UTCDateTime`), on SQLite too.
- JSON columns are `JSON` (JSONB on PostgreSQL); an attribute may not be called `metadata` on a
  declarative class, so those columns are named `metadata` in SQL but `meta` in Python. NaN and
  infinities inside JSON values are stored as null (`memory.engine.json_dumps`), the same on both
  backends, since PostgreSQL's JSONB cannot hold them.
- State lives in columns with named values (the constants below), never in free text: a lesson set's
  `status` and `made_by`, an evaluation's `kind`. A lesson set's `note` is prose for people.
- A step's prompt is stored as a recipe (`memory.prompts`): the text only that step has, a reference to
  the earlier step of its episode whose prompt it extends, and a content-addressed `PromptPart` (the
  system part an episode's first prompt shares with other episodes); reads rebuild the exact text.
- Derived lookups are tables the store keeps in the same transaction as their source: `LessonSource`
  (which lessons came from an episode, for the episode page and `memory prune`), `CyclePoint` (an OPCD
  cycle's curves, one row per training step, appended instead of rewriting the whole curve).
- The schema is created and evolved only by the Alembic migrations in `memory/migrations/`;
  `tests/memory/test_memory_schema.py` checks that these classes and the migrations agree.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy import text as sql_text  # imported under another name: `text` is a column of the models
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from memory.engine import without_nul

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

EPISODE_OUTCOMES = ("won", "lost", "truncated", "error")
LESSON_STATUSES = ("proposed", "active", "consolidated", "retired")
ADAPTER_STATUSES = ("candidate", "active", "rejected", "retired")
CYCLE_STATUSES = ("running", "succeeded", "failed", "promoted", "rolled_back")
EMBEDDING_KINDS = ("episode", "lesson")

# A lesson-set version is live (the lessons in context from then on) or a candidate awaiting the gate;
# the live set is the newest live version.
LESSON_SET_LIVE = "live"
LESSON_SET_CANDIDATE = "candidate"
LESSON_SET_STATUSES = (LESSON_SET_LIVE, LESSON_SET_CANDIDATE)
# Who made a version: the agent's own phases, or a person (`lessons add|retire`, `lessons.seed`), whose
# pending candidate the loop gates before it plays.
MADE_BY_AGENT = "agent"
MADE_BY_USER = "user"
LESSON_SET_MAKERS = (MADE_BY_AGENT, MADE_BY_USER)
# A lesson a person wrote says so in its metadata (`metadata["source"]`, also its extraction's `extractor`);
# one the agent extracted from episodes has no source there.
LESSON_SOURCE_USER = "user"
# What an evaluation row holds: a policy played held-out episodes ("eval"), the validation gate's decision
# on a candidate lesson set ("gate"), or lesson utilities measured on logged episodes ("lesson-utility").
EVALUATION_EVAL = "eval"
EVALUATION_GATE = "gate"
EVALUATION_LESSON_UTILITY = "lesson-utility"
EVALUATION_KINDS = (EVALUATION_EVAL, EVALUATION_GATE, EVALUATION_LESSON_UTILITY)


def utcnow() -> dt.datetime:
    """The current time, timezone-aware UTC (the only kind of datetime this package stores)."""
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A datetime stored as UTC and returned timezone-aware, whatever the backend keeps.

    Naive datetimes given to the store are taken to be UTC already (the runtime only makes UTC times).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        value = value.astimezone(dt.UTC)
        # SQLite has no time zones: keep a naive UTC value there so ordering and comparison are textual.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class NulFreeText(TypeDecorator[str]):
    """Text whose NUL characters are stored as U+FFFD: PostgreSQL refuses NUL in text, SQLite keeps it, and
    an observation or a model reply may hold one; both backends store the same thing."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return without_nul(value) if isinstance(value, str) else value


class NulFreeString(NulFreeText):
    """A bounded `String(n)` with NUL characters stored as U+FFFD (see `NulFreeText`)."""

    impl = String
    cache_ok = True


JSONType = JSON().with_variant(JSONB(), "postgresql")  # NaN and NUL are handled by `memory.engine.json_dumps`


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dt.datetime: UTCDateTime(),
        dict[str, Any]: JSONType,
        list[Any]: JSONType,
    }


class Run(Base):
    """One long-lived run of the loop: its resolved config and the persisted state machine cursor."""

    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(NulFreeString(200), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    phase: Mapped[str] = mapped_column(NulFreeString(40), default="PLAY")
    state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(NulFreeString(40), default="running")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Adapter(Base):
    """A LoRA adapter on disk: where it is, what it was trained from, and whether it is in use."""

    __tablename__ = "adapters"
    __table_args__ = (CheckConstraint(f"status IN {ADAPTER_STATUSES}", name="status"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    name: Mapped[str] = mapped_column(NulFreeString(200))
    path: Mapped[str] = mapped_column(NulFreeText)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("adapters.id"))
    base_model: Mapped[str | None] = mapped_column(NulFreeString(300))
    status: Mapped[str] = mapped_column(NulFreeString(20), default="candidate")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    fingerprint: Mapped[str | None] = mapped_column(String(64))  # of the files the trainer wrote


class Episode(Base):
    """One played episode: what was played, by which policy and context, and how it ended."""

    __tablename__ = "episodes"
    __table_args__ = (
        CheckConstraint(f"outcome IN {EPISODE_OUTCOMES}", name="outcome"),
        Index("ix_episodes_run_id_id", "run_id", "id"),
        Index("ix_episodes_env_id_outcome", "env_id", "outcome"),
        Index("ix_episodes_run_id_ended_at", "run_id", "ended_at"),  # prune by age, the dashboard's cycle marks
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    env_id: Mapped[str] = mapped_column(NulFreeString(200))
    task_id: Mapped[str] = mapped_column(NulFreeString(500))
    seed: Mapped[int | None] = mapped_column(Integer)
    policy: Mapped[str] = mapped_column(NulFreeString(300))
    adapter_id: Mapped[int | None] = mapped_column(ForeignKey("adapters.id"))
    lesson_set_version: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(NulFreeString(20))
    won: Mapped[bool] = mapped_column(Boolean)
    total_return: Mapped[float] = mapped_column(Float)
    num_steps: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[dt.datetime]
    ended_at: Mapped[dt.datetime]
    error: Mapped[str | None] = mapped_column(NulFreeText)
    goal: Mapped[str | None] = mapped_column(NulFreeText)
    summary: Mapped[str] = mapped_column(NulFreeText, default="")
    lessons_in_context: Mapped[list[Any]] = mapped_column(default=list)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    adapter_fingerprint: Mapped[str | None] = mapped_column(String(64))  # of the weights its backend had loaded


class Step(Base):
    """One turn of an episode: what the agent saw, was prompted with, answered, and what it earned."""

    __tablename__ = "steps"
    __table_args__ = (
        UniqueConstraint("episode_id", "step_index", name="uq_steps_episode_index"),
        # which steps use a prompt part (prune drops unused parts): only an episode's first step has one
        Index(
            "ix_steps_prompt_part_id",
            "prompt_part_id",
            sqlite_where=sql_text("prompt_part_id IS NOT NULL"),
            postgresql_where=sql_text("prompt_part_id IS NOT NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column("step_index", Integer)
    observation: Mapped[str] = mapped_column(NulFreeText)
    # The prompt's recipe (memory.prompts): `prompt` holds only the text no other row has.
    prompt: Mapped[str] = mapped_column(NulFreeText)
    prompt_part_id: Mapped[int | None] = mapped_column(ForeignKey("prompt_parts.id"))
    prompt_base: Mapped[int | None] = mapped_column(Integer)
    prompt_keep: Mapped[int | None] = mapped_column(Integer)
    prompt_resume: Mapped[int | None] = mapped_column(Integer)
    prompt_observation_at: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[str] = mapped_column(NulFreeText)
    action: Mapped[str | None] = mapped_column(NulFreeText)
    valid_action: Mapped[bool] = mapped_column(Boolean)
    reward: Mapped[float] = mapped_column(Float)
    admissible_actions: Mapped[list[Any] | None] = mapped_column(JSONType)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_s: Mapped[float] = mapped_column(Float, default=0.0)
    info: Mapped[dict[str, Any]] = mapped_column(default=dict)


class PromptPart(Base):
    """A text that many prompts start with (a system prompt and its lessons), stored once by its sha256."""

    __tablename__ = "prompt_parts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    text: Mapped[str] = mapped_column(NulFreeText)


class Extraction(Base):
    """One lesson-extraction call: which episodes were read, by which model, and what it answered."""

    __tablename__ = "extractions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    extractor: Mapped[str] = mapped_column(NulFreeString(300))
    episode_ids: Mapped[list[Any]] = mapped_column(default=list)
    prompt: Mapped[str] = mapped_column(NulFreeText, default="")
    response: Mapped[str] = mapped_column(NulFreeText, default="")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)


class Cycle(Base):
    """One OPCD consolidation cycle: its config, the adapter it started from and made, metrics, curves."""

    __tablename__ = "opcd_cycles"
    __table_args__ = (CheckConstraint(f"status IN {CYCLE_STATUSES}", name="status"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    status: Mapped[str] = mapped_column(NulFreeString(20), default="running")
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    lesson_set_version: Mapped[int | None] = mapped_column(Integer)
    base_adapter_id: Mapped[int | None] = mapped_column(ForeignKey("adapters.id"))
    adapter_id: Mapped[int | None] = mapped_column(ForeignKey("adapters.id"))
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    curves: Mapped[dict[str, Any]] = mapped_column(default=dict)
    episode_ids: Mapped[list[Any]] = mapped_column(default=list)  # where its training prompts came from
    error: Mapped[str | None] = mapped_column(NulFreeText)
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[dt.datetime | None]


class CyclePoint(Base):
    """One training step's values of an OPCD cycle's curves ({"loss": ..., "kl": ...}), appended per step."""

    __tablename__ = "cycle_points"
    __table_args__ = (UniqueConstraint("cycle_id", "step", name="uq_cycle_points_cycle_step"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cycle_id: Mapped[int] = mapped_column(ForeignKey("opcd_cycles.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)  # metric -> its value at this step


class Lesson(Base):
    """One experience item: its text, life-cycle status, pool, provenance and usage statistics."""

    __tablename__ = "lessons"
    __table_args__ = (
        CheckConstraint(f"status IN {LESSON_STATUSES}", name="status"),
        # a forgotten lesson stays retired (migration 0007: a CHECK on PostgreSQL, triggers on SQLite)
        CheckConstraint("forgotten_at IS NULL OR status = 'retired'", name="forgotten_retired"),
        Index("ix_lessons_run_id_status", "run_id", "status"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    text: Mapped[str] = mapped_column(NulFreeText)
    status: Mapped[str] = mapped_column(NulFreeString(20), default="proposed")
    pool: Mapped[int] = mapped_column(Integer, default=0)
    env_id: Mapped[str | None] = mapped_column(NulFreeString(200))  # where its evidence came from
    # the environments whose prompts it may enter (`distill.lessons.scope`): ids, "family:NAME", or "*"
    scope: Mapped[list[Any]] = mapped_column(default=lambda: ["*"], server_default=sql_text("'[\"*\"]'"))
    source_episode_ids: Mapped[list[Any]] = mapped_column(default=list)
    extraction_id: Mapped[int | None] = mapped_column(ForeignKey("extractions.id"))
    consolidated_cycle_id: Mapped[int | None] = mapped_column(ForeignKey("opcd_cycles.id"))
    token_count: Mapped[int] = mapped_column(Integer, default=0)
    times_in_context: Mapped[int] = mapped_column(Integer, default=0)
    wins_in_context: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    forgotten_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)  # `lessons forget` (status retired)


class LessonSource(Base):
    """One episode a lesson came from: `Lesson.source_episode_ids` as rows, indexed by episode. No foreign
    key to the episode: provenance outlives a pruned episode."""

    __tablename__ = "lesson_sources"
    lesson_id: Mapped[int] = mapped_column(ForeignKey("lessons.id", ondelete="CASCADE"), primary_key=True)
    episode_id: Mapped[int] = mapped_column(Integer, primary_key=True, index=True)


class LessonSet(Base):
    """A numbered, immutable version of the lessons in context (per run); episodes cite its number."""

    __tablename__ = "lesson_sets"
    __table_args__ = (
        UniqueConstraint("run_id", "version", name="uq_lesson_sets_run_version"),
        CheckConstraint(f"status IN {LESSON_SET_STATUSES}", name="status"),
        CheckConstraint(f"made_by IN {LESSON_SET_MAKERS}", name="made_by"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(NulFreeString(20), default=LESSON_SET_LIVE)
    made_by: Mapped[str] = mapped_column(NulFreeString(20), default=MADE_BY_AGENT)
    token_count: Mapped[int] = mapped_column(Integer, default=0)
    note: Mapped[str] = mapped_column(NulFreeText, default="")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class LessonSetMember(Base):
    """A lesson's membership (and position) in one lesson-set version."""

    __tablename__ = "lesson_set_members"
    lesson_set_id: Mapped[int] = mapped_column(ForeignKey("lesson_sets.id", ondelete="CASCADE"), primary_key=True)
    lesson_id: Mapped[int] = mapped_column(ForeignKey("lessons.id"), primary_key=True, index=True)
    position: Mapped[int] = mapped_column(Integer)


class Evaluation(Base):
    """One evaluation of a policy (optionally an adapter, lesson set or cycle) on an environment split,
    or (by `kind`) a gate decision or measured lesson utilities."""

    __tablename__ = "evaluations"
    __table_args__ = (CheckConstraint(f"kind IN {EVALUATION_KINDS}", name="kind"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(NulFreeString(20), default=EVALUATION_EVAL)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    adapter_id: Mapped[int | None] = mapped_column(ForeignKey("adapters.id"), index=True)
    cycle_id: Mapped[int | None] = mapped_column(ForeignKey("opcd_cycles.id"), index=True)
    lesson_set_version: Mapped[int | None] = mapped_column(Integer)
    env_id: Mapped[str] = mapped_column(NulFreeString(200))
    split: Mapped[str] = mapped_column(NulFreeString(40), default="eval")
    policy: Mapped[str] = mapped_column(NulFreeString(300), default="")
    num_episodes: Mapped[int] = mapped_column(Integer, default=0)
    success_rate: Mapped[float | None] = mapped_column(Float)
    mean_return: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class Embedding(Base):
    """The vector of one episode summary or lesson under one embedder: the truth FAISS indexes cache."""

    __tablename__ = "embeddings"
    __table_args__ = (
        CheckConstraint(f"kind IN {EMBEDDING_KINDS}", name="kind"),
        UniqueConstraint("kind", "model", "item_id", name="uq_embeddings_kind_model_item"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(NulFreeString(20))
    model: Mapped[str] = mapped_column(NulFreeString(300))
    item_id: Mapped[int] = mapped_column(Integer)
    dim: Mapped[int] = mapped_column(Integer)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class RunRequest(Base):
    """What an operator asked of a run, carried out by its loop at the next phase boundary (`kind`
    `reconsolidate`: an OPCD cycle on top of the adapter a `lessons forget` rolled back to). Pending until
    `done_at` is set, with what came of it in `outcome`."""

    __tablename__ = "run_requests"
    __table_args__ = (Index("ix_run_requests_run_id_done_at", "run_id", "done_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(NulFreeString(40))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    done_at: Mapped[dt.datetime | None] = mapped_column(nullable=True)
    outcome: Mapped[dict[str, Any]] = mapped_column(default=dict)
