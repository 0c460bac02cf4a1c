"""Bounded storage over weeks: delete a run's old episodes, never the ones that provenance points at.

What (methods on `ExperienceStore`):
- `prune_plan(run_id, keep_last=, days=)` -> `PrunePlan`: what pruning would delete, read-only. An episode
  of the run is kept when it is among the run's `keep_last` newest, or ended within the last `days` days
  (given both, either keeps it); of the rest, it is kept anyway when it is *protected*:
  - a live lesson's provenance names it (`lesson_sources` of a lesson that is not retired), or
  - an adapter's training set holds it (`episode_ids` of an OPCD cycle that is running, trained, or
    promoted: its adapter is a candidate, active or an ancestor; a rolled-back cycle's adapter is
    rejected, and its training set is not kept), or
  - it is the store's newest episode (SQLite would give its id to the next episode, and a retired lesson's
    provenance that still names it would then point at a stranger).
- `prune(plan, progress=)`: deletes the plan's episodes (their steps go with them, their vectors too),
  a batch per transaction (a kill loses nothing: what is left is a smaller plan), then the prompt parts
  no step uses any more; the episode FAISS indexes on disk are rebuilt from the vectors left in SQL,
  so they stay consistent with it (another process that holds an index in memory only finds ids that
  are gone, which searches skip, and a file it saves later is checked against SQL when next loaded).
- `vacuum()`: return freed space to the file system (SQLite `VACUUM`; PostgreSQL `VACUUM ANALYZE`).

Why a plan: `agent-runtime memory prune` shows what it would delete and deletes only with `--yes`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import delete, exists, func, select
from sqlalchemy.orm import Session

from memory.errors import InvalidRecordError, NotFoundError, ReadOnlyStoreError
from memory.index import VectorIndex
from memory.models import Cycle, Embedding, Episode, Lesson, LessonSource, PromptPart, Run, Step, utcnow

BATCH = 500
PROTECTING_CYCLES = ("running", "succeeded", "promoted")

Progress = Callable[[str, int, int], None]


@dataclass
class PrunePlan:
    """What pruning a run deletes and keeps (see the module docstring); `episode_ids` are deleted."""

    run_id: int
    keep_last: int | None
    days: float | None
    episodes: int  # of the run, now
    episode_ids: list[int] = field(default_factory=list)
    steps: int = 0
    kept_recent: int = 0
    kept_for_lessons: int = 0
    kept_for_adapters: int = 0
    kept_newest: int = 0
    oldest: dt.datetime | None = None  # ended_at of the oldest and newest episode deleted
    newest: dt.datetime | None = None

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["oldest"], out["newest"] = (d.isoformat() if d else None for d in (self.oldest, self.newest))
        return out

    def ranges(self) -> str:
        """The deleted ids as ranges: "3-40, 42, 45-60"."""
        parts, ids = [], self.episode_ids
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or ids[i] != ids[i - 1] + 1:
                parts.append(str(ids[start]) if start == i - 1 else f"{ids[start]}-{ids[i - 1]}")
                start = i
        return ", ".join(parts)


class PruneMixin:
    """Pruning and vacuuming (see module docstring)."""

    if TYPE_CHECKING:  # provided by ExperienceStore and RetrievalMixin
        url: str
        dialect: str
        read_only: bool
        engine: Any
        index_dir: Path
        approx_threshold: int
        _indexes: dict[str, Any]

        def _read(self) -> AbstractContextManager[Session]: ...

        def _write(self) -> AbstractContextManager[Session]: ...

    def prune_plan(
        self, run_id: int, *, keep_last: int | None = None, days: float | None = None, now: dt.datetime | None = None
    ) -> PrunePlan:
        """What `prune` would delete from run `run_id` (nothing is written)."""
        if keep_last is None and days is None:
            raise InvalidRecordError("say what to keep: the last N episodes (keep_last) and/or the last D days (days)")
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0):
            raise InvalidRecordError(f"keep_last is a number of episodes, 0 or more; got {keep_last!r}")
        if days is not None and not (isinstance(days, int | float) and math.isfinite(days) and days >= 0):
            raise InvalidRecordError(f"days is a number of days, 0 or more; got {days!r}")
        with self._read() as session:
            if session.get(Run, run_id) is None:
                raise NotFoundError(f"no run with id {run_id} in {self.url}")
            in_run = Episode.run_id == run_id
            total = int(session.scalar(select(func.count(Episode.id)).where(in_run)) or 0)
            old = [in_run]
            if keep_last is not None:
                boundary = session.scalar(
                    select(Episode.id).where(in_run).order_by(Episode.id.desc()).offset(keep_last).limit(1)
                )
                if boundary is None:  # the run has no more than keep_last episodes
                    return PrunePlan(run_id, keep_last, days, total, kept_recent=total)
                old.append(Episode.id <= boundary)
            if days is not None:
                old.append(Episode.ended_at < (now or utcnow()) - dt.timedelta(days=days))
            candidates = list(session.scalars(select(Episode.id).where(*old).order_by(Episode.id)))
            live = (
                select(LessonSource.episode_id)
                .join(Lesson, Lesson.id == LessonSource.lesson_id)
                .where(Lesson.status != "retired")
            )
            doomed_set = set(candidates)
            for_lessons = set(session.scalars(live)) & doomed_set
            for_adapters: set[int] = set()
            for ids in session.scalars(select(Cycle.episode_ids).where(Cycle.status.in_(PROTECTING_CYCLES))):
                for_adapters.update(i for i in ids or [] if isinstance(i, int))
            for_adapters = (for_adapters & doomed_set) - for_lessons
            newest = session.scalar(select(func.max(Episode.id)))
            kept_newest = {newest} - for_lessons - for_adapters if newest in doomed_set else set()
            keep = for_lessons | for_adapters | kept_newest
            doomed = [i for i in candidates if i not in keep]
            plan = PrunePlan(
                run_id,
                keep_last,
                days,
                total,
                doomed,
                kept_recent=total - len(candidates),
                kept_for_lessons=len(for_lessons),
                kept_for_adapters=len(for_adapters),
                kept_newest=len(kept_newest),
            )
            if doomed:
                plan.steps, plan.oldest, plan.newest = self._doomed_extent(session, doomed)
            return plan

    @staticmethod
    def _doomed_extent(session: Session, ids: list[int]) -> tuple[int, dt.datetime, dt.datetime]:
        steps, oldest, newest = 0, None, None
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            n, first, last = session.execute(
                select(
                    func.coalesce(func.sum(Episode.num_steps), 0),
                    func.min(Episode.ended_at),
                    func.max(Episode.ended_at),
                ).where(Episode.id.in_(chunk))
            ).one()
            steps += int(n)
            oldest = first if oldest is None or first < oldest else oldest
            newest = last if newest is None or last > newest else newest
        return steps, oldest, newest

    def prune(self, plan: PrunePlan, *, progress: Progress | None = None) -> PrunePlan:
        """Delete the plan's episodes (recomputed first, so that nothing protected since is lost); returns
        the plan that was carried out."""
        plan = self.prune_plan(plan.run_id, keep_last=plan.keep_last, days=plan.days)
        done = 0
        for start in range(0, len(plan.episode_ids), BATCH):
            chunk = plan.episode_ids[start : start + BATCH]
            with self._write() as session:
                session.execute(delete(Embedding).where(Embedding.kind == "episode", Embedding.item_id.in_(chunk)))
                session.execute(delete(Step).where(Step.episode_id.in_(chunk)))
                session.execute(delete(Episode).where(Episode.id.in_(chunk)))
            done += len(chunk)
            if progress:
                progress("delete episodes", done, len(plan.episode_ids))
        if plan.episode_ids:
            self._drop_unused_parts()
            self._rebuild_episode_indexes(progress)
        return plan

    def _drop_unused_parts(self) -> None:
        try:
            with self._write() as session:
                used = exists().where(Step.prompt_part_id == PromptPart.id)
                session.execute(delete(PromptPart).where(~used))
        except InvalidRecordError:
            pass  # a writer began using a part meanwhile (its foreign key refused the delete); the next prune drops it

    def _rebuild_episode_indexes(self, progress: Progress | None) -> None:
        """Every episode index file, rebuilt from the vectors SQL still holds (its embedder's)."""
        self._indexes.pop("episode", None)
        for sidecar in sorted(self.index_dir.glob("episode-*.json")) if self.index_dir.is_dir() else []:
            try:
                meta = json.loads(sidecar.read_text())
            except (OSError, ValueError):
                meta = {}
            model = meta.get("model")
            path = sidecar.with_suffix(".faiss")
            if not isinstance(model, str):
                path.unlink(missing_ok=True)
                sidecar.unlink(missing_ok=True)
                continue
            with self._read() as session:
                rows = session.execute(
                    select(Embedding.item_id, Embedding.vector)
                    .where(Embedding.kind == "episode", Embedding.model == model)
                    .order_by(Embedding.item_id)
                ).all()
            if not rows:
                path.unlink(missing_ok=True)
                sidecar.unlink(missing_ok=True)
                continue
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
            index = VectorIndex.build(ids, vectors, approx_threshold=self.approx_threshold)
            index.save(
                path, sidecar, {**meta, "dim": index.dim, "count": index.count, "approximate": index.approximate}
            )
            if progress:
                progress(f"index episodes ({model})", index.count, index.count)

    def vacuum(self) -> None:
        """Give the space of deleted rows back to the file system (SQLite: `VACUUM`, which rewrites the file
        and needs as much free disk; PostgreSQL: `VACUUM ANALYZE`, which makes it reusable)."""
        if self.read_only:
            raise ReadOnlyStoreError(f"the memory at {self.url} was opened read-only; open it writable to vacuum")
        if self.dialect == "sqlite":  # on the driver's connection: the engine would wrap it in a BEGIN
            with self.engine.connect() as conn:
                conn.connection.dbapi_connection.execute("VACUUM")
            return
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
