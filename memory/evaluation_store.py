"""The store's evaluation rows (part of `ExperienceStore`).

What: `add_evaluation(env_id, ..., kind=) -> id`, `get_evaluation(id)`,
`evaluations(run_id, adapter_id=, cycle_id=, kind=)`, `latest_evaluation(run_id, kind=)`.

Why one table with a `kind`: every row is a result about a policy, a lesson set or a cycle with the
same shape (episodes, a success rate, metrics), but readers want one kind at a time -- a policy played
held-out episodes (`EVALUATION_EVAL`, the default), the validation gate's decision on a candidate lesson
set (`EVALUATION_GATE`), or lesson utilities measured on logged episodes (`EVALUATION_LESSON_UTILITY`).
The kind is a checked column, so no reader has to recognise a row by its `split` text.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from memory.models import EVALUATION_EVAL, EVALUATION_KINDS, Evaluation
from memory.records import EvaluationInfo, to_info
from memory.store_mixin import StoreMixin, check_value, same_run


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
            return to_info(
                EvaluationInfo, self._get(session, Evaluation, evaluation_id, "evaluation")
            )

    def latest_evaluation(self, run_id: int | None, *, kind: str | None = None) -> EvaluationInfo | None:
        """The run's newest evaluation (of `kind`), read alone (snapshot rows can be large)."""
        query = select(Evaluation).where(same_run(Evaluation.run_id, run_id))
        if kind is not None:
            query = query.where(Evaluation.kind == kind)
        with self._read() as session:
            row = session.scalars(query.order_by(Evaluation.id.desc()).limit(1)).first()
            return to_info(EvaluationInfo, row) if row is not None else None

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
