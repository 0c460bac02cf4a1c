"""The store's lessons and the extraction calls that produced them (part of `ExperienceStore`).

What (every write is one transaction, every read returns dataclasses):
- Lessons are experience items with a life cycle proposed -> active -> consolidated -> retired:
  `record_extraction(extractor, lessons, ...) -> (extraction_id, lesson_ids)` writes an extraction call
  and the lessons it produced together; `add_lesson(text, ...)`, `get_lesson(id)`,
  `lessons(run_id, status=, pool=, env_id=, ids=, limit=, offset=)`, `count_lessons(...)`,
  `set_lesson_status(ids, status, cycle_id=)`, `lessons_from_episode(episode_id, run_id=)`.
- Provenance: a lesson's `source_episode_ids` are also written as `lesson_sources` rows, in the same
  transaction, so that "which lessons came from this episode" is an index lookup (`lessons_from_episode`),
  not a scan of every lesson's JSON list.
- A forgotten lesson (`forget_lessons`, `forgotten_at` set) is retired for good: `set_lesson_status` refuses to move
  it anywhere else and `create_lesson_set` to put it in a version (`forgotten_among`), and the database refuses a
  row that is forgotten and not retired (migration 0007), so no rollback, import or curation makes it live again.
- Usage statistics (`times_in_context`, `wins_in_context`) are kept by `add_episode` from each
  episode's `lessons_in_context` (`_count_lesson_usage`, in the episode's own transaction).
- Extractions: `get_extraction(id)`, `extractions(run_id)`.

Why extractions live here: an extraction and its lessons are written in one transaction, so that a
lesson never exists without the call that proposed it (its provenance).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Select, func, insert, select, update
from sqlalchemy.orm import Session

from memory.errors import InvalidRecordError, NotFoundError
from memory.models import LESSON_STATUSES, Extraction, Lesson, LessonSource, utcnow
from memory.records import ExtractionInfo, LessonInfo, to_info
from memory.store_mixin import StoreMixin, check_value

MAX_SCOPE_ENTRIES = 64
MAX_SCOPE_CHARS = 200


def _default_scope(env_id: str | None) -> list[str]:
    """A lesson from an environment's episodes is scoped to it; one from nowhere in particular, to all."""
    return [env_id] if env_id else ["*"]


def check_scope(scope: Sequence[str]) -> list[str]:
    """A lesson scope as stored: a non-empty list of at most 64 non-empty strings of at most 200 characters
    (`distill.lessons.scope` says what they mean; this is the store's own guard, also for imports)."""
    if isinstance(scope, str) or not isinstance(scope, Sequence):
        raise InvalidRecordError(f"a lesson's scope is a list of environment ids, got {type(scope).__name__}")
    entries = list(scope)
    if not entries or len(entries) > MAX_SCOPE_ENTRIES:
        raise InvalidRecordError(f"a lesson's scope lists 1 to {MAX_SCOPE_ENTRIES} entries, got {len(entries)}")
    for entry in entries:
        if not isinstance(entry, str) or not entry or len(entry) > MAX_SCOPE_CHARS or "\x00" in entry:
            raise InvalidRecordError(
                f"a lesson's scope entries are environment ids, family:NAME or '*' (1-{MAX_SCOPE_CHARS} "
                f"characters), got {repr(entry)[:80]}"
            )
    return entries


def forgotten_among(session: Session, lesson_ids: Iterable[int]) -> list[int]:
    """The forgotten lessons among `lesson_ids`, in id order."""
    ids = list(dict.fromkeys(lesson_ids))
    if not ids:
        return []
    query = select(Lesson.id).where(Lesson.id.in_(ids), Lesson.forgotten_at.is_not(None)).order_by(Lesson.id)
    return list(session.scalars(query))


def refuse_forgotten(session: Session, lesson_ids: Iterable[int], what: str) -> None:
    """`InvalidRecordError` when a forgotten lesson is among `lesson_ids` (`what` would bring it back)."""
    forgotten = forgotten_among(session, lesson_ids)
    if forgotten:
        shown = ", ".join(f"#{i}" for i in forgotten)
        raise InvalidRecordError(
            f"lesson {shown} was forgotten (`lessons forget`) and stays retired: {what} would bring it back; "
            "leave it out"
        )


class LessonsMixin(StoreMixin):
    """Lessons and extractions (see module docstring)."""

    def add_lesson(
        self,
        text: str,
        *,
        run_id: int | None = None,
        status: str = "proposed",
        pool: int = 0,
        env_id: str | None = None,
        source_episode_ids: Sequence[int] = (),
        extraction_id: int | None = None,
        token_count: int = 0,
        metadata: dict[str, Any] | None = None,
        scope: Sequence[str] = ("*",),
    ) -> int:
        """Store one lesson; returns its id. `scope`: the environments whose prompts it may enter."""
        check_value(status, LESSON_STATUSES, "lesson status")
        with self._write() as session:
            row = Lesson(
                run_id=run_id,
                text=text,
                status=status,
                pool=pool,
                env_id=env_id,
                source_episode_ids=list(source_episode_ids),
                extraction_id=extraction_id,
                token_count=token_count,
                meta=metadata or {},
                scope=check_scope(scope),
            )
            session.add(row)
            session.flush()
            self._add_sources(session, {row.id: row.source_episode_ids})
            return row.id

    def _add_sources(self, session: Session, sources: dict[int, Sequence[int]]) -> None:
        rows = []
        for lesson_id, episode_ids in sources.items():
            for episode_id in dict.fromkeys(episode_ids):
                if isinstance(episode_id, bool) or not isinstance(episode_id, int):
                    raise InvalidRecordError(f"a lesson's source episode ids are integers, got {episode_id!r}")
                rows.append({"lesson_id": lesson_id, "episode_id": episode_id})
        if rows:
            session.execute(insert(LessonSource), rows)

    def lessons_from_episode(self, episode_id: int, *, run_id: int | None = None) -> list[LessonInfo]:
        """The lessons whose provenance names the episode, oldest first (of `run_id` or of no run, if given)."""
        query = (
            select(Lesson)
            .join(LessonSource, LessonSource.lesson_id == Lesson.id)
            .where(LessonSource.episode_id == episode_id)
        )
        if run_id is not None:
            query = query.where((Lesson.run_id == run_id) | Lesson.run_id.is_(None))
        with self._read() as session:
            return [to_info(LessonInfo, r) for r in session.scalars(query.order_by(Lesson.id))]

    def record_extraction(
        self,
        extractor: str,
        lessons: Sequence[str | dict[str, Any]],
        *,
        run_id: int | None = None,
        episode_ids: Sequence[int] = (),
        prompt: str = "",
        response: str = "",
        env_id: str | None = None,
        pool: int = 0,
        metadata: dict[str, Any] | None = None,
    ) -> tuple[int, list[int]]:
        """Store one extraction call and the lessons it produced, in one transaction.

        Each lesson is a text or a dict with `text` and any of `pool`, `env_id`, `scope`, `status`,
        `token_count`, `source_episode_ids`, `metadata` (defaults: the call's own values, "proposed", scope
        the call's `env_id` or every environment without one).
        Returns (extraction id, lesson ids in order).
        """
        with self._write() as session:
            extraction = Extraction(
                run_id=run_id,
                extractor=extractor,
                episode_ids=list(episode_ids),
                prompt=prompt,
                response=response,
                meta=metadata or {},
            )
            session.add(extraction)
            session.flush()
            rows = []
            now = utcnow()
            for item in lessons:
                spec = {"text": item} if isinstance(item, str) else dict(item)
                status = spec.get("status", "proposed")
                check_value(status, LESSON_STATUSES, "lesson status")
                rows.append(
                    {
                        "run_id": run_id,
                        "text": spec["text"],
                        "status": status,
                        "pool": spec.get("pool", pool),
                        "env_id": spec.get("env_id", env_id),
                        "scope": check_scope(spec.get("scope", _default_scope(spec.get("env_id", env_id)))),
                        "source_episode_ids": list(spec.get("source_episode_ids", episode_ids)),
                        "extraction_id": extraction.id,
                        "token_count": spec.get("token_count", 0),
                        "meta": spec.get("metadata", {}),
                        "created_at": now,
                        "updated_at": now,
                    }
                )
            ids = [session.execute(insert(Lesson).returning(Lesson.id), [r]).scalar_one() for r in rows]
            self._add_sources(session, {i: r["source_episode_ids"] for i, r in zip(ids, rows, strict=True)})
            return extraction.id, ids

    def get_lesson(self, lesson_id: int) -> LessonInfo:
        with self._read() as session:
            return to_info(LessonInfo, self._get(session, Lesson, lesson_id, "lesson"))

    def _lesson_query(
        self,
        query: Select[Any],
        run_id: int | None,
        status: str | Sequence[str] | None,
        pool: int | None,
        env_id: str | None,
        ids: Iterable[int] | None,
    ) -> Select[Any]:
        if run_id is not None:
            query = query.where(Lesson.run_id == run_id)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            query = query.where(Lesson.status.in_(statuses))
        if pool is not None:
            query = query.where(Lesson.pool == pool)
        if env_id is not None:
            query = query.where(Lesson.env_id == env_id)
        if ids is not None:
            query = query.where(Lesson.id.in_(list(ids)))
        return query

    def lessons(
        self,
        run_id: int | None = None,
        *,
        status: str | Sequence[str] | None = None,
        pool: int | None = None,
        env_id: str | None = None,
        ids: Iterable[int] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[LessonInfo]:
        """Lessons matching the filters, oldest first (the order they entered the context)."""
        query = self._lesson_query(select(Lesson), run_id, status, pool, env_id, ids)
        query = query.order_by(Lesson.id).offset(offset)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as session:
            return [to_info(LessonInfo, r) for r in session.scalars(query)]

    def count_lessons(
        self,
        run_id: int | None = None,
        *,
        status: str | Sequence[str] | None = None,
        pool: int | None = None,
        env_id: str | None = None,
    ) -> int:
        query = self._lesson_query(select(func.count(Lesson.id)), run_id, status, pool, env_id, None)
        with self._read() as session:
            return int(session.scalar(query) or 0)

    def forget_lessons(self, lesson_ids: Iterable[int], *, reason: str = "") -> None:
        """Mark lessons forgotten (`agent-runtime lessons forget`): status retired, `forgotten_at` now, and
        the reason in their metadata. Their rows and provenance stay: what was forgotten stays on record."""
        ids = list(lesson_ids)
        with self._write() as session:
            now = utcnow()
            for lesson in session.scalars(select(Lesson).where(Lesson.id.in_(ids))):
                lesson.status, lesson.forgotten_at, lesson.updated_at = "retired", now, now
                lesson.meta = {**(lesson.meta or {}), "forgotten": reason or "forgotten"}

    def set_lesson_scope(self, lesson_ids: Iterable[int], scope: Sequence[str], trials: dict[str, Any]) -> None:
        """Narrow lessons' scope to where their trial let them in; `trials` (per environment, its decision) goes
        into their metadata as `scope_trials`, beside the scope they were proposed with."""
        checked = check_scope(scope)
        with self._write() as session:
            for lesson in session.scalars(select(Lesson).where(Lesson.id.in_(list(lesson_ids)))):
                lesson.meta = {**lesson.meta, "proposed_scope": lesson.scope, "scope_trials": trials}
                lesson.scope, lesson.updated_at = checked, utcnow()

    def set_lesson_status(self, lesson_ids: Iterable[int], status: str, *, cycle_id: int | None = None) -> None:
        """Move lessons to `status` (and record the consolidating cycle, if given); a forgotten lesson may only
        stay retired (`InvalidRecordError`)."""
        check_value(status, LESSON_STATUSES, "lesson status")
        ids = list(lesson_ids)
        with self._write() as session:
            self._set_lesson_status(session, ids, status, cycle_id)

    def _set_lesson_status(self, session: Session, ids: list[int], status: str, cycle_id: int | None) -> None:
        if status != "retired":
            refuse_forgotten(session, ids, f"status {status!r}")
        values: dict[str, Any] = {"status": status, "updated_at": utcnow()}
        if cycle_id is not None:
            values["consolidated_cycle_id"] = cycle_id
        changed = session.execute(update(Lesson).where(Lesson.id.in_(ids)).values(**values))
        if changed.rowcount != len(set(ids)):
            found = set(session.scalars(select(Lesson.id).where(Lesson.id.in_(ids))))
            raise NotFoundError(f"no lessons with ids {sorted(set(ids) - found)} in {self.url}")

    def _count_lesson_usage(self, session: Session, lesson_ids: list[int], won: bool) -> None:
        session.execute(
            update(Lesson)
            .where(Lesson.id.in_(lesson_ids))
            .values(
                times_in_context=Lesson.times_in_context + 1,
                wins_in_context=Lesson.wins_in_context + (1 if won else 0),
            )
        )

    def get_extraction(self, extraction_id: int) -> ExtractionInfo:
        with self._read() as session:
            return to_info(ExtractionInfo, self._get(session, Extraction, extraction_id, "extraction"))

    def extractions(self, run_id: int | None = None, *, limit: int = 100) -> list[ExtractionInfo]:
        """Extractions, newest first."""
        query = select(Extraction).order_by(Extraction.id.desc()).limit(limit)
        if run_id is not None:
            query = query.where(Extraction.run_id == run_id)
        with self._read() as session:
            return [to_info(ExtractionInfo, r) for r in session.scalars(query)]
