"""The store's OPCD cycles, and the atomic PROMOTE and ROLLBACK (part of `ExperienceStore`).

What: `start_cycle(run_id, config, ...) -> id`, `update_cycle(id, status=, metrics=, curves=,
adapter_id=, error=, ended=)`, `get_cycle(id)`, `cycles(run_id, status=)`;
`promote_cycle(id, lesson_ids)` (cycle promoted, its adapter active, the previously active adapter of
the run retired, the lessons consolidated by it) and `rollback_cycle(id, error=)` (cycle rolled back,
its adapter rejected).

Why promotion is here: it changes a cycle, two adapters and lessons together, and must be ONE
transaction so that the loop's PROMOTE/ROLLBACK is atomic; the cycle is what it is about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from memory.errors import InvalidRecordError
from memory.models import CYCLE_STATUSES, Adapter, Cycle, utcnow
from memory.records import CycleInfo, to_info
from memory.store_mixin import StoreMixin, check_value, same_run


class CyclesMixin(StoreMixin):
    """OPCD cycles (see module docstring)."""

    if TYPE_CHECKING:  # provided by LessonsMixin

        def _set_lesson_status(
            self, session: Session, ids: list[int], status: str, cycle_id: int | None
        ) -> None: ...

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
                check_value(status, CYCLE_STATUSES, "cycle status")
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
        return self._listed(Cycle, CycleInfo, run_id=run_id, status=status)

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
