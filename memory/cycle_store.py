"""The store's OPCD cycles, and the atomic PROMOTE and ROLLBACK (part of `ExperienceStore`).

What: `start_cycle(run_id, config, ..., episode_ids=) -> id`, `update_cycle(id, status=, metrics=, curves=,
episode_ids=, adapter_id=, error=, ended=)`, `append_cycle_point(id, {"loss": ..., ...}) -> step`,
`get_cycle(id)`, `cycles(run_id, status=)`;
`promote_cycle(id, lesson_ids)` (cycle promoted, its adapter active, the previously active adapter of
the run retired, the lessons consolidated by it) and `rollback_cycle(id, error=)` (cycle rolled back,
its adapter rejected).

Why promotion is here: it changes a cycle, two adapters and lessons together, and must be ONE
transaction so that the loop's PROMOTE/ROLLBACK is atomic; the cycle is what it is about.

Curves are written a step at a time: `append_cycle_point` inserts one `cycle_points` row (a training
step's values), where rewriting the whole `curves` JSON at every step would cost O(steps^2) over a cycle.
A read's `CycleInfo.curves` is the `curves` column with every point appended, per metric, in step order
(what a driver polling `cycles(run_id, status="running")` shows as progress); `update_cycle(curves=)`
replaces both. `episode_ids` are the episodes a cycle's prompts came from: its adapter's training set,
which `memory prune` keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from memory.errors import InvalidRecordError
from memory.models import CYCLE_STATUSES, Adapter, Cycle, CyclePoint, utcnow
from memory.records import CycleInfo, to_info
from memory.store_mixin import StoreMixin, check_value, same_run


class CyclesMixin(StoreMixin):
    """OPCD cycles (see module docstring)."""

    if TYPE_CHECKING:  # provided by LessonsMixin

        def _set_lesson_status(self, session: Session, ids: list[int], status: str, cycle_id: int | None) -> None: ...

    def start_cycle(
        self,
        run_id: int | None,
        config: dict[str, Any],
        *,
        lesson_set_version: int | None = None,
        base_adapter_id: int | None = None,
        episode_ids: Sequence[int] = (),
    ) -> int:
        """Record the start of an OPCD cycle (status "running"); returns its id."""
        with self._write() as session:
            row = Cycle(
                run_id=run_id,
                config=config,
                lesson_set_version=lesson_set_version,
                base_adapter_id=base_adapter_id,
                episode_ids=_episode_ids(episode_ids),
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
        episode_ids: Sequence[int] | None = None,
        adapter_id: int | None = None,
        error: str | None = None,
        ended: bool = False,
    ) -> None:
        """Replace the given fields of a cycle (`curves` replaces the appended points too); `ended=True`
        stamps its end time."""
        with self._write() as session:
            row = self._get(session, Cycle, cycle_id, "OPCD cycle")
            if status is not None:
                check_value(status, CYCLE_STATUSES, "cycle status")
                row.status = status
            if metrics is not None:
                row.metrics = metrics
            if curves is not None:
                row.curves = curves
                session.execute(delete(CyclePoint).where(CyclePoint.cycle_id == cycle_id))
            if episode_ids is not None:
                row.episode_ids = _episode_ids(episode_ids)
            if adapter_id is not None:
                row.adapter_id = adapter_id
            if error is not None:
                row.error = error
            if ended:
                row.ended_at = utcnow()

    def append_cycle_point(self, cycle_id: int, values: dict[str, Any]) -> int:
        """Append one training step's values ({"loss": 0.4, "kl": 0.1, ...}) to the cycle's curves, as one
        small row; returns the step's number (0 for the first)."""
        points = CyclePoint.__table__
        with self._write() as session:
            self._get(session, Cycle, cycle_id, "OPCD cycle")
            step = select(func.coalesce(func.max(points.c.step) + 1, 0)).where(points.c.cycle_id == cycle_id)
            return session.execute(
                points.insert()
                .values(cycle_id=cycle_id, step=step.scalar_subquery(), metrics=dict(values))
                .returning(points.c.step)
            ).scalar_one()

    def get_cycle(self, cycle_id: int) -> CycleInfo:
        with self._read() as session:
            info = to_info(CycleInfo, self._get(session, Cycle, cycle_id, "OPCD cycle"))
            return self._with_points(session, [info])[0]

    def cycles(self, run_id: int | None = None, *, status: str | None = None) -> list[CycleInfo]:
        """OPCD cycles, oldest first."""
        listed = self._listed(Cycle, CycleInfo, run_id=run_id, status=status)
        with self._read() as session:
            return self._with_points(session, listed)

    @staticmethod
    def _with_points(session: Session, cycles: list[CycleInfo]) -> list[CycleInfo]:
        """The cycles with their appended points added to their curves (see the module docstring)."""
        if not cycles:
            return cycles
        by_id = {c.id: c for c in cycles}
        points = session.execute(
            select(CyclePoint.cycle_id, CyclePoint.metrics)
            .where(CyclePoint.cycle_id.in_(list(by_id)))
            .order_by(CyclePoint.cycle_id, CyclePoint.step)
        ).all()
        copied: set[int] = set()
        for cycle_id, values in points:
            cycle = by_id[cycle_id]
            if cycle_id not in copied:
                cycle.curves = {k: list(v) if isinstance(v, list) else v for k, v in (cycle.curves or {}).items()}
                copied.add(cycle_id)
            for key, value in values.items():
                series = cycle.curves.get(key)
                if not isinstance(series, list):
                    series = cycle.curves[key] = []
                series.append(value)
        return cycles

    def promote_cycle(self, cycle_id: int, lesson_ids: Sequence[int]) -> None:
        """Atomically: cycle promoted, its adapter active (the run's previous one retired), and
        `lesson_ids` consolidated by this cycle."""
        with self._write() as session:
            cycle = self._get(session, Cycle, cycle_id, "OPCD cycle")
            if cycle.adapter_id is None:
                raise InvalidRecordError(f"OPCD cycle {cycle_id} has no adapter to promote; set it with update_cycle")
            session.execute(
                update(Adapter)
                .where(same_run(Adapter.run_id, cycle.run_id))
                .where(Adapter.status == "active")
                .values(status="retired")
            )
            session.execute(update(Adapter).where(Adapter.id == cycle.adapter_id).values(status="active"))
            cycle.status = "promoted"
            cycle.ended_at = cycle.ended_at or utcnow()
            if lesson_ids:
                self._set_lesson_status(session, list(lesson_ids), "consolidated", cycle_id)

    def rollback_cycle(self, cycle_id: int, *, error: str | None = None) -> None:
        """Atomically: cycle rolled back and its adapter (if any) rejected."""
        with self._write() as session:
            cycle = self._get(session, Cycle, cycle_id, "OPCD cycle")
            if cycle.adapter_id is not None:
                session.execute(update(Adapter).where(Adapter.id == cycle.adapter_id).values(status="rejected"))
            cycle.status = "rolled_back"
            cycle.ended_at = cycle.ended_at or utcnow()
            if error is not None:
                cycle.error = error


def _episode_ids(ids: Sequence[int]) -> list[int]:
    """A cycle's training episodes as a sorted list of distinct integers."""
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise InvalidRecordError(f"a cycle's episode ids are integers, got {list(ids)[:5]!r}...")
    return sorted(set(ids))
