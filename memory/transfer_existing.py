"""What an import may add to a run that is already in the store: nothing it acts with until its own gate says so.

What: `ExistingRuns(run_ids)` sees every decoded row of an import (`admit(table, row, where)`) and returns it as it
goes in, or None for a row left out; `notes()` says, in words, what it changed; `check_versions(session, runs)` is
run once every row is in. For a row of a run the store already held:
- a lesson arrives `proposed` (retired if it was forgotten), with no usage counts, no consolidating cycle, and none of
  the trial evidence in its metadata (`TRIAL_KEYS`: the gate's decision, `scope_trials` and the scope it was
  narrowed from, which it takes back): a file is not a trial this store saw;
- a lesson-set version arrives a candidate made by a person: the run's gate plays it against the live set before it
  can go live (the loop gates a person's pending candidate before it plays, `distill.lessons.pending_user_candidate`);
- an adapter arrives a `candidate`, never the run's active adapter;
- evaluation rows of kind gate or lesson-utility (trial evidence: utilities decide what the budget keeps) are left
  out; a run request (an order to the run's loop) and a member row added to a version the store holds (versions are
  immutable) are refused.
Once every row is in, no live version or pending candidate of such a run may hold a forgotten lesson
(`check_versions`). For every row, of a new run too, a forgotten lesson must be retired. A whole new run (the
export/import round trip) goes in exactly as exported, even from a store that a rollback before migration 0007 left
with a forgotten lesson in a live version: its readers leave that lesson out (`distill.lessons.live_lessons`).

Why: an export is data from elsewhere. Without this, a file that adds a lesson and a newer live version to an existing
run puts that lesson in every prompt of the run's next `run --resume`, with made-up trials for evidence.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from memory.errors import ImportFormatError
from memory.models import (
    EVALUATION_GATE,
    EVALUATION_LESSON_UTILITY,
    LESSON_SET_CANDIDATE,
    LESSON_SET_LIVE,
    MADE_BY_USER,
    Lesson,
    LessonSet,
    LessonSetMember,
)

TRIAL_KEYS = ("trial", "accepted", "scope_trials", "proposed_scope")
EVIDENCE_KINDS = (EVALUATION_GATE, EVALUATION_LESSON_UTILITY)


class ExistingRuns:
    """The rows of one import, held to the rules above (see the module docstring)."""

    def __init__(self, run_ids: set[int]) -> None:
        self.run_ids = run_ids
        self.lesson_sets: set[int] = set()  # ids of the versions this import brings
        self.runs_with_versions: set[int] = set()  # runs already in the store that this import gives versions
        self.stripped: dict[int, list[int]] = {}  # run -> lessons whose trial evidence was left out
        self.proposed: dict[int, list[int]] = {}  # run -> lessons that arrive proposed
        self.candidates: dict[int, list[int]] = {}  # run -> versions that arrive candidates
        self.adapters: dict[int, list[int]] = {}  # run -> adapters that arrive candidates
        self.dropped: dict[int, dict[str, int]] = {}  # run -> evaluation kind -> rows left out

    def admit(self, table: str, row: dict[str, Any], where: str) -> dict[str, Any] | None:
        """`row` as it goes into the store, or None when it is left out; `ImportFormatError` when it is refused."""
        if table == "lessons" and row["forgotten_at"] is not None and row["status"] != "retired":
            raise ImportFormatError(
                f"{where}: lesson {row['id']} is forgotten (forgotten_at is set) but {row['status']}; a forgotten "
                "lesson is retired for good"
            )
        if table == "lesson_sets":
            self.lesson_sets.add(row["id"])
            if row["run_id"] in self.run_ids:
                self.runs_with_versions.add(row["run_id"])
        if table == "lesson_set_members" and row["lesson_set_id"] not in self.lesson_sets:
            raise ImportFormatError(
                f"{where}: lesson_set_members names lesson-set version id {row['lesson_set_id']}, which is not in "
                "the file; a version already in the store is immutable (a file may add versions, not edit them)"
            )
        run = row.get("run_id")
        if run not in self.run_ids:
            return row
        if table == "lessons":
            return self._lesson(run, row)
        if table == "lesson_sets" and row["status"] == LESSON_SET_LIVE:
            self.candidates.setdefault(run, []).append(row["version"])
            return row | {"status": LESSON_SET_CANDIDATE, "made_by": MADE_BY_USER}
        if table == "adapters" and row["status"] == "active":
            self.adapters.setdefault(run, []).append(row["id"])
            return row | {"status": "candidate"}
        if table == "evaluations" and row["kind"] in EVIDENCE_KINDS:
            kinds = self.dropped.setdefault(run, {})
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
            return None
        if table == "run_requests":
            raise ImportFormatError(
                f"{where}: run request {row['id']} ({row['kind']!r}) is for run {run}, which is already in this "
                "store; a run request is an order to that run's loop, given only by this store's own commands"
            )
        return row

    def _lesson(self, run: int, row: dict[str, Any]) -> dict[str, Any]:
        metadata = dict(row["metadata"])
        scope = metadata.get("proposed_scope") or row["scope"]  # the scope before a trial narrowed it
        if any(key in metadata for key in TRIAL_KEYS):
            self.stripped.setdefault(run, []).append(row["id"])
            metadata = {k: v for k, v in metadata.items() if k not in TRIAL_KEYS}
        status = "retired" if row["forgotten_at"] is not None else "proposed"
        if status == "proposed":
            self.proposed.setdefault(run, []).append(row["id"])
        return row | {
            "status": status,
            "metadata": metadata,
            "scope": scope,
            "times_in_context": 0,
            "wins_in_context": 0,
            "consolidated_cycle_id": None,
        }

    def notes(self) -> list[str]:
        """What the import changed in rows of runs already in the store, for the person who ran it."""
        out = []
        for run, ids in self.proposed.items():
            out.append(
                f"run {run} was already in this store: lessons {_ids(ids)} arrive proposed, not in its live set; "
                "they go live only through the run's own gate"
            )
        for run, ids in self.stripped.items():
            out.append(
                f"run {run}: trial evidence ({', '.join(TRIAL_KEYS)}) of lessons {_ids(ids)} was not imported; the "
                "run's gate measures them itself"
            )
        for run, found in self.candidates.items():
            shown = ", ".join(f"v{v}" for v in found)
            out.append(
                f"run {run}: lesson-set version {shown} arrives a candidate (it was live in the file); the run's gate "
                "plays it against the live set when the run resumes"
            )
        for run, ids in self.adapters.items():
            out.append(f"run {run}: adapter {_ids(ids)} arrives a candidate (it was active in the file), not in use")
        for run, kinds in self.dropped.items():
            shown = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
            out.append(f"run {run}: evaluation rows not imported ({shown}): trial evidence comes from this store")
        return out

    def check_versions(self, session: Session, source: str) -> None:
        """No live version or pending candidate of a run already in the store that this import gave versions holds a
        forgotten lesson."""
        for run in self.runs_with_versions:
            newest = session.scalars(
                select(LessonSet).where(LessonSet.run_id == run).order_by(LessonSet.version.desc()).limit(1)
            ).first()
            live = session.scalars(
                select(LessonSet)
                .where(LessonSet.run_id == run, LessonSet.status == LESSON_SET_LIVE)
                .order_by(LessonSet.version.desc())
                .limit(1)
            ).first()
            for version in {v.id: v for v in (newest, live) if v is not None}.values():
                forgotten = session.scalars(
                    select(Lesson.id)
                    .join(LessonSetMember, LessonSetMember.lesson_id == Lesson.id)
                    .where(LessonSetMember.lesson_set_id == version.id, Lesson.forgotten_at.is_not(None))
                    .order_by(Lesson.id)
                ).all()
                if forgotten and (version.status == LESSON_SET_LIVE or version is newest):
                    raise ImportFormatError(
                        f"{source}: lesson-set version v{version.version} of run {run} ({version.status}) holds "
                        f"forgotten lessons {_ids(forgotten)}; a forgotten lesson never goes back into the context "
                        "(nothing was imported)"
                    )


def _ids(ids: list[int]) -> str:
    return ", ".join(f"#{i}" for i in ids)
