"""The store's evaluation rows (part of `ExperienceStore`).

What: `add_evaluation(env_id, ..., kind=) -> id`, `get_evaluation(id)`,
`evaluations(run_id, adapter_id=, cycle_id=, kind=)`, `latest_evaluation(run_id, kind=)`,
`latest_lesson_utilities(run_id, lesson_ids) -> {lesson id: MeasuredUtility}`.

Why one table with a `kind`: every row is a result about a policy, a lesson set or a cycle with the
same shape (episodes, a success rate, metrics), but readers want one kind at a time -- a policy played
held-out episodes (`EVALUATION_EVAL`, the default), the validation gate's decision on a candidate lesson
set (`EVALUATION_GATE`), or lesson utilities measured on logged episodes (`EVALUATION_LESSON_UTILITY`).
The kind is a checked column, so no reader has to recognise a row by its `split` text.

A lesson-utility row is a snapshot (`metrics["utilities"]`: lesson id -> its numbers) of the lessons that could
still enter a context when it was taken, so a consolidated or forgotten lesson's last measurement is in an older
snapshot than the newest. `latest_lesson_utilities` finds each lesson's newest entry in SQL (only those entries
are read, newest snapshot first), not by loading every snapshot of a long run.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select

from memory.models import EVALUATION_EVAL, EVALUATION_KINDS, EVALUATION_LESSON_UTILITY, Evaluation
from memory.records import EvaluationInfo, to_info
from memory.store_mixin import StoreMixin, check_value, same_run

UTILITY_IDS_PER_QUERY = 100  # lessons looked up by one query (one JSON path column each)


@dataclass(frozen=True)
class MeasuredUtility:
    """A lesson's entry in the newest lesson-utility snapshot that measured it."""

    lesson_id: int
    evaluation_id: int
    measured_at: dt.datetime
    entry: dict[str, Any]  # as the snapshot stored it: utility, rate_with, rate_without, n_with, n_without, ...


class EvaluationsMixin(StoreMixin):
    """Evaluations (see module docstring)."""

    def add_evaluation(
        self,
        env_id: str,
        *,
        run_id: int | None = None,
        adapter_id: int | None = None,
        cycle_id: int | None = None,
        lesson_set_version: int | None = None,
        split: str = "eval",
        kind: str = EVALUATION_EVAL,
        policy: str = "",
        num_episodes: int = 0,
        success_rate: float | None = None,
        mean_return: float | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> int:
        """Store one evaluation's results (of `kind`: see module docstring); returns its id."""
        check_value(kind, EVALUATION_KINDS, "evaluation kind")
        with self._write() as session:
            row = Evaluation(
                kind=kind,
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
            return to_info(EvaluationInfo, self._get(session, Evaluation, evaluation_id, "evaluation"))

    def latest_evaluation(self, run_id: int | None, *, kind: str | None = None) -> EvaluationInfo | None:
        """The run's newest evaluation (of `kind`), read alone (snapshot rows can be large)."""
        query = select(Evaluation).where(same_run(Evaluation.run_id, run_id))
        if kind is not None:
            query = query.where(Evaluation.kind == kind)
        with self._read() as session:
            row = session.scalars(query.order_by(Evaluation.id.desc()).limit(1)).first()
            return to_info(EvaluationInfo, row) if row is not None else None

    def latest_lesson_utilities(self, run_id: int | None, lesson_ids: Iterable[int]) -> dict[int, MeasuredUtility]:
        """Each lesson's newest measurement: its entry in the newest lesson-utility snapshot of the run that holds
        one (lessons never measured are left out). Each lesson's entry is a JSON path column, snapshots that hold
        none of them are skipped by the database, and reading stops once every lesson is found."""
        wanted = sorted({int(i) for i in lesson_ids})
        found: dict[int, MeasuredUtility] = {}
        for start in range(0, len(wanted), UTILITY_IDS_PER_QUERY):
            chunk = wanted[start : start + UTILITY_IDS_PER_QUERY]
            entries = [Evaluation.metrics[("utilities", str(i))].as_string() for i in chunk]
            query = (
                select(Evaluation.id, Evaluation.created_at, *entries)
                .where(
                    same_run(Evaluation.run_id, run_id),
                    Evaluation.kind == EVALUATION_LESSON_UTILITY,
                    or_(*[entry.is_not(None) for entry in entries]),
                )
                .order_by(Evaluation.id.desc())
                .execution_options(yield_per=20)
            )
            missing = set(chunk)
            with self._read() as session:
                for evaluation_id, measured_at, *texts in session.execute(query):
                    for lesson_id, text in zip(chunk, texts):
                        if lesson_id in missing and text is not None:
                            values = json.loads(text)
                            if isinstance(values, dict):
                                found[lesson_id] = MeasuredUtility(lesson_id, evaluation_id, measured_at, values)
                                missing.discard(lesson_id)
                    if not missing:
                        break
        return found

    def evaluations(
        self,
        run_id: int | None = None,
        *,
        adapter_id: int | None = None,
        cycle_id: int | None = None,
        kind: str | None = None,
    ) -> list[EvaluationInfo]:
        """Evaluations (of `kind`, if given), oldest first."""
        return self._listed(
            Evaluation, EvaluationInfo, run_id=run_id, adapter_id=adapter_id, cycle_id=cycle_id, kind=kind
        )
