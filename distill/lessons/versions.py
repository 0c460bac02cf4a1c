"""Lesson-set versions: which set is live, candidates, promotion, rollback (restore), and diffs.

What (all functions take the store and the run id; none needs a model or a tokenizer, so the CLI's
`lessons list|show|diff|rollback` can call them directly):
- `live_version(store, run_id) -> LessonSetInfo | None`: the set in context now.
- `pending_candidate(store, run_id)`: a candidate newer than the live set, awaiting the gate.
- `create_version(store, run_id, lesson_ids, candidate=, by_user=, note=, token_count=)`: a new version.
- `promote_candidate(store, run_id, version, note=)`, `reject_candidate(store, run_id, version, note=)`.
- `restore_version(store, run_id, version, note=)`: make an old version's lessons live again
  (`agent-runtime lessons rollback VERSION`), less those forgotten since (`forgotten_since`).
- `diff_versions(store, run_id, v1, v2) -> LessonSetDiff` (added, removed, kept, and which added
  lessons merged or updated which removed ones), with `to_dict()` for `--json`.
- `live_lessons(store, run_id, pool=None) -> (version, lessons)`: what the prompts show now.
- `lesson_provenance(store, lesson_id) -> dict`: a lesson with its extraction, source episodes,
  predecessors and versions (`agent-runtime lessons show`).
- `sync_statuses(store, run_id)`: lesson statuses follow the versions (idempotent; safe on resume).

Why this design:
- Lesson rows are immutable: a merge or a correction writes a new row that names its predecessors in
  its metadata (`merged_from`, `target`/`replaces`). So a version, which lists lesson ids, is an exact
  snapshot forever, and restoring version 3 brings back exactly the texts that were live in version 3.
- Every version is a new row and nothing is edited in place, so history is complete: a candidate that
  the gate blocked stays visible, followed by a live version that keeps the previous set.
- A version is live or a candidate (its `status`, `memory.LESSON_SET_LIVE`/`LESSON_SET_CANDIDATE`), and
  was made by the agent or by a person (`made_by`, `memory.MADE_BY_AGENT`/`MADE_BY_USER`: `lessons
  add`/`retire`, `lessons.seed`; `is_user_version`). Both are columns; the note says in words why the
  version was made. The live set is the newest live version. Writing the version row is the single
  commit point; statuses are derived from the versions afterwards (`sync_statuses`), so a crash between
  the two is repaired by calling it again.
- Statuses: members of the live set are "active"; members of a pending candidate stay "proposed";
  everything else is "retired". "consolidated" belongs to the OPCD phase and is never changed here.
- A forgotten lesson never comes back: a rollback or a promotion of an old version leaves it out and its note says
  so, and the store refuses a version that holds one (`memory.lesson_store.refuse_forgotten`). A live version
  written before that rule by a store that broke it is read without its forgotten lessons (`live_lessons`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distill.lessons.errors import UnknownVersionError
from distill.lessons.gate import load_utilities
from memory import LESSON_SET_CANDIDATE, LESSON_SET_LIVE, MADE_BY_AGENT, MADE_BY_USER

if TYPE_CHECKING:
    from memory import ExperienceStore, LessonInfo, LessonSetInfo


def is_candidate(info: LessonSetInfo) -> bool:
    return info.status == LESSON_SET_CANDIDATE


def is_user_version(info: LessonSetInfo) -> bool:
    """Whether a person made this version (`lessons add`/`retire`, `lessons.seed`)."""
    return info.made_by == MADE_BY_USER


def live_version(store: ExperienceStore, run_id: int | None) -> LessonSetInfo | None:
    """The newest live version of the run (the lessons in context now), or None."""
    return store.lesson_set(run_id, status=LESSON_SET_LIVE)


def pending_candidate(store: ExperienceStore, run_id: int | None) -> LessonSetInfo | None:
    """The newest version if it is a candidate (newer than the live version, awaiting its gate), else None."""
    newest = store.lesson_set(run_id)
    return newest if newest is not None and is_candidate(newest) else None


def live_lessons(
    store: ExperienceStore, run_id: int | None, pool: int | None = None
) -> tuple[LessonSetInfo | None, list[LessonInfo]]:
    """The live version and its lessons in order (of one pool, or all): what the prompts show."""
    live = live_version(store, run_id)
    if live is None or not live.lesson_ids:
        return live, []
    rows = {x.id: x for x in store.lessons(run_id, ids=live.lesson_ids)}
    ordered = [rows[i] for i in live.lesson_ids if rows[i].forgotten_at is None]
    return live, [x for x in ordered if pool is None or x.pool == pool]


def forgotten_since(store: ExperienceStore, run_id: int | None, lesson_ids: Sequence[int]) -> list[int]:
    """The lessons among `lesson_ids` that were forgotten (they never come back), in their order."""
    rows = {x.id: x for x in store.lessons(run_id, ids=lesson_ids)} if lesson_ids else {}
    return [i for i in lesson_ids if i in rows and rows[i].forgotten_at is not None]


def _without_forgotten(
    store: ExperienceStore, run_id: int | None, info: LessonSetInfo, text: str
) -> tuple[list[int], str]:
    """`info`'s lessons less the forgotten ones, and `text` saying which were left out."""
    gone = forgotten_since(store, run_id, info.lesson_ids)
    if gone:
        text += " without forgotten " + ", ".join(f"#{i}" for i in gone)
    return [i for i in info.lesson_ids if i not in gone], text


def get_version(store: ExperienceStore, run_id: int | None, version: int) -> LessonSetInfo:
    """Version `version` of the run, or a typed error that lists the versions there are."""
    info = store.lesson_set(run_id, version)
    if info is None:
        known = [s.version for s in store.lesson_sets(run_id)]
        shown = ", ".join(map(str, known)) if known else "none yet"
        raise UnknownVersionError(f"no lesson-set version {version} in run {run_id}; known: {shown}")
    return info


def create_version(
    store: ExperienceStore,
    run_id: int | None,
    lesson_ids: Sequence[int],
    *,
    candidate: bool = False,
    by_user: bool = False,
    note: str = "",
    token_count: int = 0,
) -> LessonSetInfo:
    """Write a new version (live or candidate; made by a person if `by_user`) and bring the statuses in line."""
    info = store.create_lesson_set(
        run_id,
        list(lesson_ids),
        token_count=token_count,
        note=note.strip(),
        status=LESSON_SET_CANDIDATE if candidate else LESSON_SET_LIVE,
        made_by=MADE_BY_USER if by_user else MADE_BY_AGENT,
    )
    sync_statuses(store, run_id)
    return info


def promote_candidate(store: ExperienceStore, run_id: int | None, version: int, *, note: str = "") -> LessonSetInfo:
    """Make candidate `version` live (as a new live version with the same lessons, less any forgotten since)."""
    info = get_version(store, run_id, version)
    ids, text = _without_forgotten(store, run_id, info, f"promoted candidate v{version}")
    text += f"; {note}" if note else ""
    return create_version(store, run_id, ids, note=text, token_count=info.token_count)


def reject_candidate(
    store: ExperienceStore, run_id: int | None, version: int, *, note: str = ""
) -> LessonSetInfo | None:
    """Block candidate `version`: a new live version keeps the current live lessons (None if the run
    never had a live set: then the candidate's lessons are simply retired)."""
    get_version(store, run_id, version)
    live = live_version(store, run_id)
    text = f"blocked candidate v{version}" + (f"; {note}" if note else "")
    if live is None:
        create_version(store, run_id, [], note=text)
        return None
    return create_version(
        store, run_id, live.lesson_ids, note=f"kept v{live.version}; {text}", token_count=live.token_count
    )


def restore_version(store: ExperienceStore, run_id: int | None, version: int, *, note: str = "") -> LessonSetInfo:
    """Make the lessons of `version` live again, as a new live version (history is kept), less those forgotten
    since (its note names them; `forgotten_since` says which)."""
    info = get_version(store, run_id, version)
    ids, text = _without_forgotten(store, run_id, info, f"restored v{version}")
    text += f"; {note}" if note else ""
    return create_version(store, run_id, ids, note=text, token_count=info.token_count)


def sync_statuses(store: ExperienceStore, run_id: int | None) -> None:
    """Statuses follow the versions: live members active, pending-candidate members proposed, other
    proposed/active lessons retired. Consolidated and forgotten lessons are left alone. Idempotent."""
    live = live_version(store, run_id)
    live_ids = set(live.lesson_ids) if live else set()
    pending = pending_candidate(store, run_id)
    pending_ids = set(pending.lesson_ids) if pending else set()
    lessons = [x for x in store.lessons(run_id, status=["proposed", "active", "retired"]) if x.forgotten_at is None]
    to_active = [x.id for x in lessons if x.id in live_ids and x.status != "active"]
    to_proposed = [x.id for x in lessons if x.id in pending_ids - live_ids and x.status != "proposed"]
    to_retired = [x.id for x in lessons if x.id not in live_ids | pending_ids and x.status != "retired"]
    for ids, status in ((to_active, "active"), (to_proposed, "proposed"), (to_retired, "retired")):
        if ids:
            store.set_lesson_status(ids, status)


@dataclass
class LessonSetDiff:
    """What changed from version `old` to version `new`."""

    old: int
    new: int
    added: list[LessonInfo] = field(default_factory=list)
    removed: list[LessonInfo] = field(default_factory=list)
    kept: list[LessonInfo] = field(default_factory=list)
    merged: list[tuple[int, int]] = field(default_factory=list)  # (removed id, added id)
    updated: list[tuple[int, int]] = field(default_factory=list)  # (removed id, added id)

    def to_dict(self) -> dict[str, Any]:
        def brief(x: LessonInfo) -> dict[str, Any]:
            return {
                "id": x.id,
                "pool": x.pool,
                "text": x.text,
                "source_episode_ids": x.source_episode_ids,
                "extraction_id": x.extraction_id,
            }

        return {
            "old": self.old,
            "new": self.new,
            "added": [brief(x) for x in self.added],
            "removed": [brief(x) for x in self.removed],
            "kept": [x.id for x in self.kept],
            "merged": [list(p) for p in self.merged],
            "updated": [list(p) for p in self.updated],
        }


def predecessors(lesson: LessonInfo) -> tuple[list[int], list[int]]:
    """(ids this lesson merged, ids it updated/replaced), from its metadata."""
    merged = [int(i) for i in lesson.metadata.get("merged_from", [])]
    updated = [int(i) for i in (lesson.metadata.get("target"), lesson.metadata.get("replaces")) if i is not None]
    return merged, updated


def diff_versions(store: ExperienceStore, run_id: int | None, old: int, new: int) -> LessonSetDiff:
    """Lessons added, removed and kept between two versions, and the merge/update links between them."""
    a = get_version(store, run_id, old)
    b = get_version(store, run_id, new)
    wanted = set(a.lesson_ids) | set(b.lesson_ids)
    rows = {x.id: x for x in store.lessons(run_id, ids=wanted)} if wanted else {}
    added_ids = [i for i in b.lesson_ids if i not in set(a.lesson_ids)]
    removed_ids = [i for i in a.lesson_ids if i not in set(b.lesson_ids)]
    diff = LessonSetDiff(
        old,
        new,
        added=[rows[i] for i in added_ids],
        removed=[rows[i] for i in removed_ids],
        kept=[rows[i] for i in b.lesson_ids if i in set(a.lesson_ids)],
    )
    removed = set(removed_ids)
    for lesson in diff.added:
        for relation, ancestor in _ancestors_among(store, run_id, lesson, removed, wanted):
            (diff.merged if relation == "merged" else diff.updated).append((ancestor, lesson.id))
    return diff


def _ancestors_among(
    store: ExperienceStore, run_id: int | None, lesson: LessonInfo, targets: set[int], stop: set[int]
) -> list[tuple[str, int]]:
    """The `targets` this lesson descends from, through lessons in neither version (one curation round can
    merge a lesson into a new one and that one into another). The relation is the first hop's: a lesson that
    merged an intermediate descends from what that intermediate replaced by merging."""
    merged, updated = predecessors(lesson)
    found: list[tuple[str, int]] = []
    todo = [("merged", i) for i in merged] + [("updated", i) for i in updated]
    seen = {lesson.id}
    while todo:
        relation, parent_id = todo.pop(0)
        if parent_id in seen:
            continue
        seen.add(parent_id)
        if parent_id in targets:
            found.append((relation, parent_id))
        elif parent_id not in stop:  # an intermediate that no version held: follow it
            for parent in store.lessons(run_id, ids=[parent_id]):
                more_merged, more_updated = predecessors(parent)
                todo += [(relation, i) for i in more_merged + more_updated]
    return found


def lesson_provenance(store: ExperienceStore, lesson_id: int) -> dict[str, Any]:
    """Everything a reader needs to trust a lesson (`agent-runtime lessons show`): the lesson, the
    extraction that made it, its source episodes, the lessons it merged or replaced (transitively),
    and the versions that hold it."""
    lesson = store.get_lesson(lesson_id)
    extraction = store.get_extraction(lesson.extraction_id) if lesson.extraction_id else None
    episodes = []
    for episode_id in lesson.source_episode_ids:
        episode = store.episode(episode_id)
        episodes.append(
            {
                "id": episode.id,
                "env_id": episode.env_id,
                "task_id": episode.task_id,
                "outcome": episode.outcome,
                "num_steps": episode.num_steps,
            }
        )
    ancestry, todo, seen = [], [lesson], {lesson.id}
    while todo:
        merged, updated = predecessors(todo.pop())
        for relation, ids in (("merged", merged), ("replaced", updated)):
            for parent_id in ids:
                if parent_id in seen:
                    continue
                seen.add(parent_id)
                parent = store.get_lesson(parent_id)
                ancestry.append(
                    {"id": parent.id, "relation": relation, "text": parent.text, "extraction_id": parent.extraction_id}
                )
                todo.append(parent)
    return {
        "id": lesson.id,
        "text": lesson.text,
        "status": lesson.status,
        "pool": lesson.pool,
        "env_id": lesson.env_id,
        "scope": list(lesson.scope),
        "created_at": lesson.created_at.isoformat(),
        "token_count": lesson.token_count,
        "times_in_context": lesson.times_in_context,
        "wins_in_context": lesson.wins_in_context,
        "source_episodes": episodes,
        "extraction": None
        if extraction is None
        else {
            "id": extraction.id,
            "extractor": extraction.extractor,
            "episode_ids": extraction.episode_ids,
            "created_at": extraction.created_at.isoformat(),
            "response": extraction.response,
        },
        "predecessors": ancestry,
        "versions": [v.version for v in store.lesson_sets(lesson.run_id) if lesson.id in v.lesson_ids],
        "metadata": lesson.metadata,
        "utility": _stored_utility(store, lesson),
    }


def _stored_utility(store: ExperienceStore, lesson) -> float | None:
    """The lesson's newest measured utility in play (`distill.lessons.gate.load_utilities`), if any."""
    return load_utilities(store, lesson.run_id).get(lesson.id)
