"""The store's lesson-set versions: numbered, immutable snapshots of the lessons in context, per run
(part of `ExperienceStore`).

What:
- `create_lesson_set(run_id, lesson_ids, token_count=, note=, status=, made_by=) -> LessonSetInfo` writes
  the run's next version number;
- `lesson_set(run_id, version=None, status=None)`: that version, or the newest (of that status);
- `lesson_sets(run_id, status=None)`: all versions of the run, oldest first.
A version never holds a forgotten lesson (`memory.lesson_store.refuse_forgotten`).

Why the state is in columns: whether a version is live or a candidate awaiting the gate (`status`,
`LESSON_SET_LIVE`/`LESSON_SET_CANDIDATE`), and whether a person made it (`made_by`,
`MADE_BY_AGENT`/`MADE_BY_USER`), decide what the agent plays with, so they are values the database
checks, not words in the `note`, which is prose for people. What the versions mean for the loop
(promotion, rollback, statuses) is `distill.lessons.versions`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from memory.lesson_store import refuse_forgotten
from memory.models import (
    LESSON_SET_LIVE,
    LESSON_SET_MAKERS,
    LESSON_SET_STATUSES,
    MADE_BY_AGENT,
    LessonSet,
    LessonSetMember,
)
from memory.records import LessonSetInfo
from memory.store_mixin import StoreMixin, check_value, same_run


class LessonSetsMixin(StoreMixin):
    """Lesson-set versions (see module docstring)."""

    def create_lesson_set(
        self,
        run_id: int | None,
        lesson_ids: Sequence[int],
        *,
        token_count: int = 0,
        note: str = "",
        status: str = LESSON_SET_LIVE,
        made_by: str = MADE_BY_AGENT,
    ) -> LessonSetInfo:
        """Freeze `lesson_ids` (in order) as the run's next lesson-set version (live unless `status`
        says candidate; made by the agent unless `made_by` says a person). A forgotten lesson among them is an
        `InvalidRecordError`: a version is what may go live."""
        check_value(status, LESSON_SET_STATUSES, "lesson-set status")
        check_value(made_by, LESSON_SET_MAKERS, "lesson-set maker")
        with self._write() as session:
            refuse_forgotten(session, lesson_ids, f"a {status} lesson-set version holding it")
            newest = session.scalar(select(func.max(LessonSet.version)).where(same_run(LessonSet.run_id, run_id)))
            row = LessonSet(
                run_id=run_id,
                version=(newest or 0) + 1,
                status=status,
                made_by=made_by,
                token_count=token_count,
                note=note,
            )
            session.add(row)
            session.flush()
            if lesson_ids:
                session.execute(
                    insert(LessonSetMember),
                    [{"lesson_set_id": row.id, "lesson_id": lid, "position": i} for i, lid in enumerate(lesson_ids)],
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
            status=row.status,
            made_by=row.made_by,
            token_count=row.token_count,
            note=row.note,
            created_at=row.created_at,
        )

    def lesson_set(
        self, run_id: int | None, version: int | None = None, *, status: str | None = None
    ) -> LessonSetInfo | None:
        """The run's lesson set `version` (None: the newest, of `status` if given), or None if
        there is none."""
        query = select(LessonSet).where(same_run(LessonSet.run_id, run_id))
        if version is not None:
            query = query.where(LessonSet.version == version)
        if status is not None:
            query = query.where(LessonSet.status == status)
        with self._read() as session:
            row = session.scalars(query.order_by(LessonSet.version.desc()).limit(1)).first()
            return self._lesson_set_info(session, row) if row is not None else None

    def lesson_sets(self, run_id: int | None, *, status: str | None = None) -> list[LessonSetInfo]:
        """All lesson-set versions of the run (of `status`, if given), oldest first."""
        query = select(LessonSet).where(same_run(LessonSet.run_id, run_id))
        if status is not None:
            query = query.where(LessonSet.status == status)
        with self._read() as session:
            rows = list(session.scalars(query.order_by(LessonSet.version)))
            return [self._lesson_set_info(session, r) for r in rows]
