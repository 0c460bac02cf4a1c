"""`ExperienceStore`: the one door to the experience memory (runs, episodes and steps live here).

What: open a store from a workdir, an SQLite file or a URL (`ExperienceStore.open`), migrate it,
and read and write it. This module holds the core -- opening, runs, episodes with their steps,
stats; the other tables' methods come from one mixin per family of tables, each documented in its
module: `memory.lesson_store` (lessons and extractions), `memory.lesson_set_store` (lesson-set
versions), `memory.cycle_store` (OPCD cycles, promotion and rollback), `memory.adapter_store`,
`memory.evaluation_store`, `memory.request_store` (requests to a running loop), `memory.retrieval`
(embeddings, FAISS indexes, search), `memory.transfer` (JSONL export/import) and `memory.prune` (deleting
old episodes). Callers see one object; `memory.store_mixin` says what the parts share.

Why this way:
- Writes are batched by construction: `add_episode` writes an episode, all its steps and (if given)
  the run's new loop state in ONE transaction, so a crash loses at most the episode in flight and
  never leaves half of one (see `tests/memory/test_memory_crash.py`).
- A step's prompt is stored as a recipe (`memory.prompts`: the text only that step has, the earlier step
  it extends, a shared system part); `episode()` and `step_prompt()` rebuild the exact text.
- Reads return plain dataclasses (`memory.records`), never live ORM objects.
- A read-only store (`read_only=True`, for the dashboard) is enforced by the database itself
  (SQLite `mode=ro`, PostgreSQL `default_transaction_read_only`), and by a clear error here first.

Usage::

    store = ExperienceStore.open("runs/quickstart")          # -> runs/quickstart/memory.db
    run_id = store.create_run("quickstart", config)
    ep_id = store.add_episode(run_id, record, run_state={"episodes": 1})
    store.episodes(run_id, outcome="won", limit=10)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from hashlib import sha256
from pathlib import Path
from typing import Any, Self

from sqlalchemy import Engine, func, select, text
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError, StatementError
from sqlalchemy.orm import Session, sessionmaker

from memory import migrate
from memory.adapter_store import AdaptersMixin
from memory.cycle_store import CyclesMixin
from memory.embeddings import Embedder
from memory.engine import describe, make_engine, resolve_url
from memory.errors import (
    InvalidRecordError,
    NotADatabaseError,
    NotFoundError,
    ReadOnlyStoreError,
    StoreUnavailableError,
)
from memory.evaluation_store import EvaluationsMixin
from memory.lesson_set_store import LessonSetsMixin
from memory.lesson_store import LessonsMixin
from memory.models import EPISODE_OUTCOMES, Episode, Lesson, Run, Step, utcnow
from memory.prompts import PromptEncoder, part_id, stored_prompts
from memory.prune import PruneMixin
from memory.records import EpisodeInfo, EpisodeRecord, RunInfo, StepInfo, to_info
from memory.redaction import redact_secrets
from memory.request_store import RequestsMixin
from memory.retrieval import RetrievalMixin
from memory.transfer import TransferMixin

SUMMARY_CHARS = 1000
MIGRATION_LOCK = 0x6D656D6F7279  # PostgreSQL advisory lock key held while migrating ("memory")
EPISODES = Episode.__table__
STEPS = Step.__table__


def episode_summary(record: EpisodeRecord) -> str:
    """The text an episode is retrieved by: its goal (or task id) and its first observation."""
    head = record.goal or record.task_id
    first = record.steps[0].observation if record.steps else ""
    text = f"{record.env_id} | {head}\n{first}".strip()
    return text[:SUMMARY_CHARS]


class ExperienceStore(
    LessonsMixin,
    LessonSetsMixin,
    CyclesMixin,
    AdaptersMixin,
    EvaluationsMixin,
    RequestsMixin,
    RetrievalMixin,
    TransferMixin,
    PruneMixin,
):
    """The experience memory. Create with `ExperienceStore.open(target)`; thread-safe for reads."""

    def __init__(
        self,
        engine: Engine,
        *,
        read_only: bool,
        index_dir: Path,
        embedder: Embedder | str | None,
        approx_threshold: int,
    ) -> None:
        self.engine = engine
        self.read_only = read_only
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._write_engine = engine.execution_options(sqlite_immediate=True)
        self._write_sessions = sessionmaker(self._write_engine, expire_on_commit=False)
        self._unit = threading.local()  # .session: the session of an open `transaction()` in this thread
        self._init_retrieval(index_dir=index_dir, embedder=embedder, approx_threshold=approx_threshold)

    @classmethod
    def open(
        cls,
        target: str | os.PathLike[str],
        *,
        read_only: bool = False,
        index_dir: str | os.PathLike[str] | None = None,
        embedder: Embedder | str | None = None,
        approx_threshold: int = 100_000,
    ) -> ExperienceStore:
        """Open (creating and migrating if needed) the store at `target`.

        target: a workdir (-> `<workdir>/memory.db`), an SQLite file, or a SQLAlchemy URL.
        read_only: never write, not even a migration (the dashboard's mode).
        index_dir: where FAISS index files live; default `index/` next to the SQLite file, or
            `$AGENT_RUNTIME_CACHE/indexes/<hash of the URL>` (default cache: ~/.cache/agent-runtime)
            for a server database.
        embedder: an `Embedder`, a name for `memory.embeddings.make_embedder`, or None for the
            default (loaded only when something is embedded).
        approx_threshold: above this many vectors an index is approximate (HNSW) instead of exact.
        """
        url = resolve_url(target)
        where = describe(url)
        engine = make_engine(url, read_only=read_only)
        try:
            if read_only:
                with engine.connect() as conn, conn.begin():
                    migrate.require_head(conn, where)
            else:
                # Take the write lock first (SQLite: BEGIN IMMEDIATE; PostgreSQL: an advisory lock),
                # so that processes opening a new database together migrate it one after another.
                with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
                    if url.get_backend_name() == "postgresql":
                        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
                    migrate.upgrade(conn, where)
        except DatabaseError as exc:
            engine.dispose()
            message = str(exc.orig) if exc.orig is not None else str(exc)
            if "not a database" in message or "malformed" in message:
                raise NotADatabaseError(f"{where} is not a readable SQLite database: {message}") from exc
            raise StoreUnavailableError(f"cannot open the memory at {where}: {message}") from exc
        except Exception:
            engine.dispose()
            raise
        if index_dir is None:
            if url.get_backend_name() == "sqlite" and url.database not in (None, ":memory:"):
                index_dir = Path(where).parent / "index"
            else:
                key = sha256(url.render_as_string(hide_password=True).encode()).hexdigest()[:16]
                cache = os.environ.get("AGENT_RUNTIME_CACHE", "~/.cache/agent-runtime")
                index_dir = Path(cache).expanduser() / "indexes" / key
        return cls(
            engine,
            read_only=read_only,
            index_dir=Path(index_dir),
            embedder=embedder,
            approx_threshold=approx_threshold,
        )

    @property
    def url(self) -> str:
        """The database URL (password hidden)."""
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        """Release the database connections (the store is unusable afterwards)."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions ------------------------------------------------------------------------------

    @contextmanager
    def _read(self) -> Iterator[Session]:
        outer = self._outer()
        if outer is not None:  # inside `transaction()`: read what it has written so far
            yield outer
            return
        with self._sessions() as session, session.begin():
            yield session

    def _outer(self) -> Session | None:
        return getattr(self._unit, "session", None)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction around many calls: every read and write of this store in this thread joins it,
        and it commits at the end or not at all (an error, or the process killed). A phase of the loop
        uses it so that its results and the run's cursor move land together.

        Other writers wait while it is open (SQLite: up to the busy timeout). On a rollback the in-memory
        vector indexes are dropped, so that they are rebuilt from what SQL really holds."""
        if self._outer() is not None:
            yield  # nested: part of the outer unit
            return
        with self._write() as session:
            self._unit.session = session
            try:
                yield
            except BaseException:
                self._indexes.clear()
                raise
            finally:
                self._unit.session = None

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One write transaction: committed on success, rolled back on any error (inside `transaction()`:
        part of that one)."""
        if self.read_only:
            raise ReadOnlyStoreError(
                f"the memory at {self.url} was opened read-only; open it without read_only to write"
            )
        outer = self._outer()
        try:
            if outer is not None:
                with outer.begin_nested():  # a failing call rolls back its own part, as it would alone
                    yield outer
            else:
                with self._write_sessions() as session, session.begin():
                    yield session
        except IntegrityError as exc:
            raise InvalidRecordError(f"the write violates the schema (nothing was written): {exc.orig}") from exc
        except OperationalError as exc:
            raise StoreUnavailableError(f"write to {self.url} failed: {exc.orig}") from exc
        except StatementError as exc:  # a value the database or its driver cannot take
            cause = exc.orig if exc.orig is not None else exc
            if isinstance(cause, InvalidRecordError):
                raise cause from exc
            raise InvalidRecordError(
                f"a value cannot be stored (nothing was written): {type(cause).__name__}: {cause}"
            ) from exc

    # -- runs ----------------------------------------------------------------------------------

    def create_run(self, name: str, config: dict[str, Any]) -> int:
        """Record a new run with its resolved config (secrets redacted: `memory.redaction`); returns its id.
        The phase starts at PLAY."""
        with self._write() as session:
            now = utcnow()
            row = Run(name=name, config=redact_secrets(config), state={}, created_at=now, updated_at=now)
            session.add(row)
            session.flush()
            return row.id

    def get_run(self, run_id: int) -> RunInfo:
        with self._read() as session:
            row = session.get(Run, run_id)
            if row is None:
                raise NotFoundError(f"no run with id {run_id} in {self.url}")
            return to_info(RunInfo, row)

    def find_run(self, name: str) -> RunInfo | None:
        """The most recent run called `name`, or None."""
        with self._read() as session:
            row = session.scalars(select(Run).where(Run.name == name).order_by(Run.id.desc()).limit(1)).first()
            return to_info(RunInfo, row) if row is not None else None

    def runs(self) -> list[RunInfo]:
        """All runs, oldest first."""
        with self._read() as session:
            return [to_info(RunInfo, r) for r in session.scalars(select(Run).order_by(Run.id))]

    def update_run(
        self,
        run_id: int,
        *,
        phase: str | None = None,
        state: dict[str, Any] | None = None,
        status: str | None = None,
    ) -> None:
        """Move the run's phase cursor and/or replace its state and status, atomically."""
        with self._write() as session:
            self._update_run(session, run_id, phase=phase, state=state, status=status)

    def _update_run(
        self,
        session: Session,
        run_id: int,
        *,
        phase: str | None = None,
        state: dict[str, Any] | None = None,
        status: str | None = None,
    ) -> None:
        values: dict[str, Any] = {"updated_at": utcnow()}
        if phase is not None:
            values["phase"] = phase
        if state is not None:
            values["state"] = state
        if status is not None:
            values["status"] = status
        runs = Run.__table__
        result = session.connection().execute(runs.update().where(runs.c.id == run_id).values(**values))
        if result.rowcount != 1:
            raise NotFoundError(f"no run with id {run_id} in {self.url}")

    # -- episodes ------------------------------------------------------------------------------

    def add_episode(self, run_id: int, record: EpisodeRecord, *, run_state: dict[str, Any] | None = None) -> int:
        """Write one episode, all its steps and (if given) the run's new state in ONE transaction."""
        return self.add_episodes(run_id, [record], run_state=run_state)[0]

    def add_episodes(
        self,
        run_id: int,
        records: list[EpisodeRecord],
        *,
        run_state: dict[str, Any] | None = None,
    ) -> list[int]:
        """Write a batch of episodes with their steps in ONE transaction; returns their ids."""
        for record in records:
            _validate_episode(record)
        with self._write() as session:
            # Core statements on the tables: the ORM's bulk machinery costs more CPU than SQLite.
            conn = session.connection()
            ids = []
            step_rows: list[dict[str, Any]] = []
            encoder, parts = PromptEncoder(), {}  # prompts stored as recipes (memory.prompts)
            for record in records:
                episode_id = conn.execute(
                    EPISODES.insert().returning(EPISODES.c.id), _episode_row(run_id, record)
                ).scalar_one()
                ids.append(episode_id)
                for step in sorted(record.steps, key=lambda s: s.index):
                    recipe = encoder.encode(episode_id, step.index, step.observation, step.prompt)
                    part = part_id(conn, recipe.part, parts) if recipe.part is not None else None
                    step_rows.append(_step_row(episode_id, step) | recipe.columns(part))
                if record.lessons_in_context:
                    self._count_lesson_usage(session, list(record.lessons_in_context), record.won)
            if step_rows:
                conn.execute(STEPS.insert(), step_rows)
            if run_state is not None:
                self._update_run(session, run_id, state=run_state)
            return ids

    def episode(self, episode_id: int) -> EpisodeInfo:
        """One episode with its steps in order."""
        with self._read() as session:
            row = session.get(Episode, episode_id)
            if row is None:
                raise NotFoundError(f"no episode with id {episode_id} in {self.url}")
            info = to_info(EpisodeInfo, row)
            steps = session.scalars(select(Step).where(Step.episode_id == episode_id).order_by(Step.index))
            info.steps = [to_info(StepInfo, s) for s in steps]
            prompts = stored_prompts(session.connection(), [episode_id])
            for step in info.steps:
                step.prompt = prompts[(episode_id, step.index)]
            return info

    def step_prompt(self, episode_id: int, index: int) -> str:
        """The full prompt of one step (rebuilt from its recipe: only this step and its bases are read)."""
        with self._read() as session:
            prompt = stored_prompts(session.connection(), [episode_id], up_to=index).get((episode_id, index))
        if prompt is None:
            raise NotFoundError(f"episode {episode_id} has no step {index} in {self.url}")
        return prompt

    def episodes(
        self,
        run_id: int | None = None,
        *,
        env_id: str | None = None,
        outcome: str | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = True,
    ) -> list[EpisodeInfo]:
        """Episodes (without steps) matching the filters, newest first by default."""
        query = select(Episode).where(*_episode_filters(run_id, env_id, outcome))
        order = Episode.id.desc() if newest_first else Episode.id
        with self._read() as session:
            rows = session.scalars(query.order_by(order).limit(limit).offset(offset))
            return [to_info(EpisodeInfo, r) for r in rows]

    def count_episodes(
        self, run_id: int | None = None, *, env_id: str | None = None, outcome: str | None = None
    ) -> int:
        query = select(func.count(Episode.id)).where(*_episode_filters(run_id, env_id, outcome))
        with self._read() as session:
            return int(session.scalar(query) or 0)

    def stats(self, run_id: int | None = None) -> dict[str, Any]:
        """Counts of runs, episodes, steps and lessons (of one run, if given), plus outcomes."""
        with self._read() as session:
            runs = select(func.count(Run.id))
            episodes = select(func.count(Episode.id), func.coalesce(func.sum(Episode.num_steps), 0))
            lessons = select(func.count(Lesson.id))
            outcomes = select(Episode.outcome, func.count(Episode.id)).group_by(Episode.outcome)
            if run_id is not None:
                runs = runs.where(Run.id == run_id)
                episodes = episodes.where(Episode.run_id == run_id)
                lessons = lessons.where(Lesson.run_id == run_id)
                outcomes = outcomes.where(Episode.run_id == run_id)
            n_episodes, n_steps = session.execute(episodes).one()
            return {
                "url": self.url,
                "runs": int(session.scalar(runs) or 0),
                "episodes": int(n_episodes),
                "steps": int(n_steps),
                "lessons": int(session.scalar(lessons) or 0),
                "outcomes": {o: int(n) for o, n in session.execute(outcomes)},
            }


def _episode_filters(run_id: int | None, env_id: str | None, outcome: str | None) -> list[Any]:
    """The WHERE conditions shared by the episode listing and counting reads."""
    pairs = ((Episode.run_id, run_id), (Episode.env_id, env_id), (Episode.outcome, outcome))
    return [column == value for column, value in pairs if value is not None]


def _validate_episode(record: EpisodeRecord) -> None:
    if record.outcome not in EPISODE_OUTCOMES:
        raise InvalidRecordError(f"unknown episode outcome {record.outcome!r}; known: {', '.join(EPISODE_OUTCOMES)}")
    indices = [s.index for s in record.steps]
    if len(set(indices)) != len(indices):
        raise InvalidRecordError(f"episode {record.task_id!r} has repeated step indices {indices}")


def _episode_row(run_id: int, record: EpisodeRecord) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "env_id": record.env_id,
        "task_id": record.task_id,
        "seed": record.seed,
        "policy": record.policy,
        "adapter_id": record.adapter_id,
        "adapter_fingerprint": record.adapter_fingerprint,
        "lesson_set_version": record.lesson_set_version,
        "outcome": record.outcome,
        "won": bool(record.won),
        "total_return": float(record.total_return),
        "num_steps": len(record.steps),
        "prompt_tokens": int(record.prompt_tokens),
        "completion_tokens": int(record.completion_tokens),
        "started_at": record.started_at,
        "ended_at": record.ended_at,
        "error": record.error,
        "goal": record.goal,
        "summary": episode_summary(record),
        "lessons_in_context": list(record.lessons_in_context),
        "metadata": record.metadata,
    }


def _step_row(episode_id: int, step: Any) -> dict[str, Any]:
    """The step's columns but its prompt's (the caller adds the recipe's: `memory.prompts`)."""
    return {
        "episode_id": episode_id,
        "step_index": step.index,
        "observation": step.observation,
        "response": step.response,
        "action": step.action,
        "valid_action": bool(step.valid_action),
        "reward": float(step.reward),
        "admissible_actions": step.admissible_actions,
        "prompt_tokens": int(step.prompt_tokens),
        "completion_tokens": int(step.completion_tokens),
        "latency_s": float(step.latency_s),
        "info": step.info,
    }
