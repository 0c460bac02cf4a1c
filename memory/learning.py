"""The store's methods for what the agent learns: lessons, lesson sets, extractions, cycles, adapters.

What (all on `ExperienceStore`; every write is one transaction, every read returns dataclasses):

Lessons -- experience items with a life cycle proposed -> active -> consolidated -> retired:
  `record_extraction(extractor, lessons, ...) -> (extraction_id, lesson_ids)` writes an extraction call
  and the lessons it produced together; `add_lesson(text, ...)`, `get_lesson(id)`,
  `lessons(run_id, status=, pool=, env_id=, ids=, limit=, offset=)`, `count_lessons(...)`,
  `set_lesson_status(ids, status, cycle_id=)`. Usage statistics (`times_in_context`,
  `wins_in_context`) are kept by `add_episode` from each episode's `lessons_in_context`.
Lesson sets -- numbered immutable versions of the lessons in context, per run:
  `create_lesson_set(run_id, lesson_ids, token_count=, note=) -> LessonSetInfo` (next version number),
  `lesson_set(run_id, version=None)` (None: the newest), `lesson_sets(run_id)`.
Extractions: `get_extraction(id)`, `extractions(run_id)`.
OPCD cycles: `start_cycle(run_id, config, ...) -> id`, `update_cycle(id, status=, metrics=, curves=,
  adapter_id=, error=, ended=)`, `get_cycle(id)`, `cycles(run_id, status=)`;
  `promote_cycle(id, lesson_ids)` (cycle promoted, its adapter active, the previously active adapter
  of the run retired, the lessons consolidated by it) and `rollback_cycle(id, error=)` (cycle rolled
  back, its adapter rejected) are single transactions, so the loop's PROMOTE/ROLLBACK is atomic.
Adapters: `add_adapter(name, path, ...) -> id`, `set_adapter_status(id, status)`, `get_adapter(id)`,
  `adapters(run_id, status=)`, `active_adapter(run_id)`.
Evaluations: `add_evaluation(env_id, ...) -> id`, `get_evaluation(id)`,
  `evaluations(run_id, adapter_id=, cycle_id=)`.

Why a mixin: `ExperienceStore` stays one object for callers while each module stays short.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, func, insert, select, update
from sqlalchemy.orm import Session

from memory.errors import InvalidRecordError, NotFoundError
from memory.models import (
    ADAPTER_STATUSES,
    CYCLE_STATUSES,
    LESSON_STATUSES,
    Adapter,
    Base,
    Cycle,
    Evaluation,
    Extraction,
    Lesson,
    LessonSet,
    LessonSetMember,
    utcnow,
)
from memory.records import (
    AdapterInfo,
    CycleInfo,
    EvaluationInfo,
    ExtractionInfo,
    LessonInfo,
    LessonSetInfo,
    to_info,
)


def same_run(column: Any, run_id: int | None) -> Any:
    """`column = run_id`, where a None run id matches rows that belong to no run."""
    return column.is_(None) if run_id is None else column == run_id


def _check(value: str, allowed: Sequence[str], what: str) -> None:
    if value not in allowed:
        raise InvalidRecordError(f"unknown {what} {value!r}; known: {', '.join(allowed)}")


class LearningMixin:
    """Lessons, lesson sets, extractions, OPCD cycles, adapters and evaluations (see module doc)."""

    if TYPE_CHECKING:  # provided by ExperienceStore
        url: str

        def _read(self) -> AbstractContextManager[Session]: ...

        def _write(self) -> AbstractContextManager[Session]: ...

    def _get(self, session: Session, model: type[Base], item_id: int, what: str) -> Any:
        row = session.get(model, item_id)
        if row is None:
            raise NotFoundError(f"no {what} with id {item_id} in {self.url}")
        return row

    # -- lessons -------------------------------------------------------------------------------

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
    ) -> int:
        """Store one lesson; returns its id."""
        _check(status, LESSON_STATUSES, "lesson status")
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
            )
            session.add(row)
            session.flush()
            return row.id

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

        Each lesson is a text or a dict with `text` and any of `pool`, `env_id`, `status`,
        `token_count`, `source_episode_ids`, `metadata` (defaults: the call's own values, "proposed").
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
                _check(status, LESSON_STATUSES, "lesson status")
                rows.append(
                    {
                        "run_id": run_id,
                        "text": spec["text"],
                        "status": status,
                        "pool": spec.get("pool", pool),
                        "env_id": spec.get("env_id", env_id),
                        "source_episode_ids": list(spec.get("source_episode_ids", episode_ids)),
                        "extraction_id": extraction.id,
                        "token_count": spec.get("token_count", 0),
                        "meta": spec.get("metadata", {}),
                        "created_at": now,
                        "updated_at": now,
                    }
                )
            ids = [
                session.execute(insert(Lesson).returning(Lesson.id), [r]).scalar_one() for r in rows
            ]
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
        query = self._lesson_query(
            select(func.count(Lesson.id)), run_id, status, pool, env_id, None
        )
        with self._read() as session:
            return int(session.scalar(query) or 0)

    def set_lesson_status(
        self, lesson_ids: Iterable[int], status: str, *, cycle_id: int | None = None
    ) -> None:
        """Move lessons to `status` (and record the consolidating cycle, if given)."""
        _check(status, LESSON_STATUSES, "lesson status")
        with self._write() as session:
            self._set_lesson_status(session, list(lesson_ids), status, cycle_id)

    def _set_lesson_status(
        self, session: Session, ids: list[int], status: str, cycle_id: int | None
    ) -> None:
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

    # -- lesson sets ---------------------------------------------------------------------------

    def create_lesson_set(
        self,
        run_id: int | None,
        lesson_ids: Sequence[int],
        *,
        token_count: int = 0,
        note: str = "",
    ) -> LessonSetInfo:
        """Freeze `lesson_ids` (in order) as the run's next lesson-set version."""
        with self._write() as session:
            newest = session.scalar(
                select(func.max(LessonSet.version)).where(same_run(LessonSet.run_id, run_id))
            )
            row = LessonSet(
                run_id=run_id, version=(newest or 0) + 1, token_count=token_count, note=note
            )
            session.add(row)
            session.flush()
            if lesson_ids:
                session.execute(
                    insert(LessonSetMember),
                    [
                        {"lesson_set_id": row.id, "lesson_id": lid, "position": i}
                        for i, lid in enumerate(lesson_ids)
                    ],
                )
            return self._lesson_set_info(session, row)

    def _lesson_set_info(self, session: Session, row: LessonSet) -> LessonSetInfo:
        members = session.scalars(
            select(LessonSetMember.lesson_id)
            .where(LessonSetMember.lesson_set_id == row.id)
            .order_by(LessonSetMember.position)
        )
        return LessonSetInfo(
            id=row.id,
            run_id=row.run_id,
            version=row.version,
            lesson_ids=list(members),
            token_count=row.token_count,
            note=row.note,
            created_at=row.created_at,
        )

    def lesson_set(self, run_id: int | None, version: int | None = None) -> LessonSetInfo | None:
        """The run's lesson set `version` (None: the newest), or None if there is none."""
        query = select(LessonSet).where(same_run(LessonSet.run_id, run_id))
        if version is not None:
            query = query.where(LessonSet.version == version)
        with self._read() as session:
            row = session.scalars(query.order_by(LessonSet.version.desc()).limit(1)).first()
            return self._lesson_set_info(session, row) if row is not None else None

    def lesson_sets(self, run_id: int | None) -> list[LessonSetInfo]:
        """All lesson-set versions of the run, oldest first."""
        query = select(LessonSet).where(same_run(LessonSet.run_id, run_id))
        with self._read() as session:
            rows = list(session.scalars(query.order_by(LessonSet.version)))
            return [self._lesson_set_info(session, r) for r in rows]

    # -- extractions ---------------------------------------------------------------------------

    def get_extraction(self, extraction_id: int) -> ExtractionInfo:
        with self._read() as session:
            return to_info(
                ExtractionInfo, self._get(session, Extraction, extraction_id, "extraction")
            )

    def extractions(self, run_id: int | None = None, *, limit: int = 100) -> list[ExtractionInfo]:
        """Extractions, newest first."""
        query = select(Extraction).order_by(Extraction.id.desc()).limit(limit)
        if run_id is not None:
            query = query.where(Extraction.run_id == run_id)
        with self._read() as session:
            return [to_info(ExtractionInfo, r) for r in session.scalars(query)]

    # -- OPCD cycles ---------------------------------------------------------------------------

    def start_cycle(
        self,
        run_id: int | None,
        config: dict[str, Any],
        *,
        lesson_set_version: int | None = None,
        base_adapter_id: int | None = None,
    ) -> int:
        """Record the start of an OPCD cycle (status "running"); returns its id."""
        with self._write() as session:
            row = Cycle(
                run_id=run_id,
                config=config,
                lesson_set_version=lesson_set_version,
                base_adapter_id=base_adapter_id,
                status="running",
            )
            session.add(row)
            session.flush()
            return row.id

    def update_cycle(
        self,
        cycle_id: int,
        *,
        status: str | None = None,
        metrics: dict[str, Any] | None = None,
        curves: dict[str, Any] | None = None,
        adapter_id: int | None = None,
        error: str | None = None,
        ended: bool = False,
    ) -> None:
        """Replace the given fields of a cycle; `ended=True` stamps its end time."""
        with self._write() as session:
            row = self._get(session, Cycle, cycle_id, "OPCD cycle")
            if status is not None:
                _check(status, CYCLE_STATUSES, "cycle status")
                row.status = status
            if metrics is not None:
                row.metrics = metrics
            if curves is not None:
                row.curves = curves
            if adapter_id is not None:
                row.adapter_id = adapter_id
            if error is not None:
                row.error = error
            if ended:
                row.ended_at = utcnow()

    def get_cycle(self, cycle_id: int) -> CycleInfo:
        with self._read() as session:
            return to_info(CycleInfo, self._get(session, Cycle, cycle_id, "OPCD cycle"))

    def cycles(self, run_id: int | None = None, *, status: str | None = None) -> list[CycleInfo]:
        """OPCD cycles, oldest first."""
        return self._by_run_and_status(Cycle, CycleInfo, run_id, status)

    def promote_cycle(self, cycle_id: int, lesson_ids: Sequence[int]) -> None:
        """Atomically: cycle promoted, its adapter active (the run's previous one retired), and
        `lesson_ids` consolidated by this cycle."""
        with self._write() as session:
            cycle = self._get(session, Cycle, cycle_id, "OPCD cycle")
            if cycle.adapter_id is None:
                raise InvalidRecordError(
                    f"OPCD cycle {cycle_id} has no adapter to promote; set it with update_cycle"
                )
            session.execute(
                update(Adapter)
                .where(same_run(Adapter.run_id, cycle.run_id))
                .where(Adapter.status == "active")
                .values(status="retired")
            )
            session.execute(
                update(Adapter).where(Adapter.id == cycle.adapter_id).values(status="active")
            )
            cycle.status = "promoted"
            cycle.ended_at = cycle.ended_at or utcnow()
            if lesson_ids:
                self._set_lesson_status(session, list(lesson_ids), "consolidated", cycle_id)

    def rollback_cycle(self, cycle_id: int, *, error: str | None = None) -> None:
        """Atomically: cycle rolled back and its adapter (if any) rejected."""
        with self._write() as session:
            cycle = self._get(session, Cycle, cycle_id, "OPCD cycle")
            if cycle.adapter_id is not None:
                session.execute(
                    update(Adapter).where(Adapter.id == cycle.adapter_id).values(status="rejected")
                )
            cycle.status = "rolled_back"
            cycle.ended_at = cycle.ended_at or utcnow()
            if error is not None:
                cycle.error = error

    # -- adapters ------------------------------------------------------------------------------

    def add_adapter(
        self,
        name: str,
        path: str,
        *,
        run_id: int | None = None,
        parent_id: int | None = None,
        base_model: str | None = None,
        status: str = "candidate",
        metadata: dict[str, Any] | None = None,
    ) -> int:
        """Register an adapter saved at `path`; returns its id."""
        _check(status, ADAPTER_STATUSES, "adapter status")
        with self._write() as session:
            row = Adapter(
                run_id=run_id,
                name=name,
                path=path,
                parent_id=parent_id,
                base_model=base_model,
                status=status,
                meta=metadata or {},
            )
            session.add(row)
            session.flush()
            return row.id

    def set_adapter_status(self, adapter_id: int, status: str) -> None:
        _check(status, ADAPTER_STATUSES, "adapter status")
        with self._write() as session:
            self._get(session, Adapter, adapter_id, "adapter").status = status

    def get_adapter(self, adapter_id: int) -> AdapterInfo:
        with self._read() as session:
            return to_info(AdapterInfo, self._get(session, Adapter, adapter_id, "adapter"))

    def adapters(self, run_id: int | None = None, *, status: str | None = None) -> list[AdapterInfo]:
        """Adapters, oldest first."""
        return self._by_run_and_status(Adapter, AdapterInfo, run_id, status)

    def _by_run_and_status(self, model: Any, info: Any, run_id: int | None, status: str | None) -> list[Any]:
        """Rows of `model` (oldest first) filtered by run and status, as `info` records."""
        query = select(model).order_by(model.id)
        if run_id is not None:
            query = query.where(model.run_id == run_id)
        if status is not None:
            query = query.where(model.status == status)
        with self._read() as session:
            return [to_info(info, r) for r in session.scalars(query)]

    def active_adapter(self, run_id: int | None = None) -> AdapterInfo | None:
        """The newest adapter with status "active" (of the run, if given), or None."""
        found = self.adapters(run_id, status="active")
        return found[-1] if found else None

    # -- evaluations ---------------------------------------------------------------------------

    def add_evaluation(
        self,
        env_id: str,
        *,
        run_id: int | None = None,
        adapter_id: int | None = None,
        cycle_id: int | None = None,
        lesson_set_version: int | None = None,
        split: str = "eval",
        policy: str = "",
        num_episodes: int = 0,
        success_rate: float | None = None,
        mean_return: float | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> int:
        """Store one evaluation's results; returns its id."""
        with self._write() as session:
            row = Evaluation(
                env_id=env_id,
                run_id=run_id,
                adapter_id=adapter_id,
                cycle_id=cycle_id,
                lesson_set_version=lesson_set_version,
                split=split,
                policy=policy,
                num_episodes=num_episodes,
                success_rate=success_rate,
                mean_return=mean_return,
                metrics=metrics or {},
            )
            session.add(row)
            session.flush()
            return row.id

    def get_evaluation(self, evaluation_id: int) -> EvaluationInfo:
        with self._read() as session:
            return to_info(
                EvaluationInfo, self._get(session, Evaluation, evaluation_id, "evaluation")
            )

    def evaluations(
        self,
        run_id: int | None = None,
        *,
        adapter_id: int | None = None,
        cycle_id: int | None = None,
    ) -> list[EvaluationInfo]:
        """Evaluations, oldest first."""
        query = select(Evaluation).order_by(Evaluation.id)
        if run_id is not None:
            query = query.where(Evaluation.run_id == run_id)
        if adapter_id is not None:
            query = query.where(Evaluation.adapter_id == adapter_id)
        if cycle_id is not None:
            query = query.where(Evaluation.cycle_id == cycle_id)
        with self._read() as session:
            return [to_info(EvaluationInfo, r) for r in session.scalars(query)]

