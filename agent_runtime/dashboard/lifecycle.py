"""The whole life of one lesson, and which weights acted in one episode: the reads behind the lesson page's life
and the episode page's adapter check.

What: `lesson_life(store, lesson)` answers, from the store alone, where the lesson came from (episodes, through an
extraction, or a person), every lesson-set version that held it (number, live or candidate, who made it, when),
the OPCD cycles taught with it (those whose lesson-set version held it) and the adapters they trained, whether a
cycle consolidated it, and whether it was forgotten (`forgotten_at`) and what that forget undid: the versions it
wrote and, when it rolled the run's adapter back, the run request `lessons forget` left (the adapters it tainted,
the one the run went back to, the lessons that came back into the context, and whether the re-consolidation has
run). `life.events` is all of that in time order. `adapter_check(store, episode)` compares the fingerprint of the
weights the backend had loaded (the episode's) with the one of the files the trainer wrote (the adapter's).

Why a module of its own: the lesson page's question ("what did this lesson do to the agent, and is it gone?")
joins five tables; `reads.py` holds the single-table views. Reads only `memory`, like the rest of the dashboard.
A person's lesson is recognised by `metadata["source"] == memory.LESSON_SOURCE_USER` (what `distill.lessons.user_lessons`
writes); a person's lesson-set versions by `made_by == memory.MADE_BY_USER`.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import or_, select

from agent_runtime.dashboard.reads import read_session
from memory import LESSON_SOURCE_USER, MADE_BY_USER, EpisodeInfo, ExperienceStore, LessonInfo
from memory.models import Adapter, Cycle, LessonSet, LessonSetMember, RunRequest
from memory.records import AdapterInfo, CycleInfo, RequestInfo, to_info

RECONSOLIDATE = "reconsolidate"  # the kind of run request a forget that rolled an adapter back leaves
_FORGOT = re.compile(r"forgot #(\d+)")  # how a forget's reason names the lesson it was asked to forget


@dataclass
class HeldBy:
    """One lesson-set version that held the lesson."""

    version: int
    status: str
    made_by: str
    note: str
    created_at: dt.datetime


@dataclass
class TaughtInto:
    """An OPCD cycle whose lesson set held the lesson (the teacher had it in context), and the adapter it made."""

    cycle: CycleInfo
    adapter: AdapterInfo | None
    consolidated_it: bool


@dataclass
class Forgetting:
    """What `lessons forget` recorded: when, why, the versions it wrote, and (when it rolled the run's adapter
    back) its run request's payload and outcome."""

    at: dt.datetime
    reason: str
    versions: list[int] = field(default_factory=list)
    request: RequestInfo | None = None
    tainted: list[AdapterInfo] = field(default_factory=list)
    back_to: AdapterInfo | None = None
    restored: list[int] = field(default_factory=list)

    @property
    def rolled_back(self) -> bool:
        return self.request is not None


@dataclass
class LessonLife:
    origin: str  # "episodes", "user" or "unknown"
    held_by: list[HeldBy]
    taught_into: list[TaughtInto]
    consolidated_by: CycleInfo | None
    forgotten: Forgetting | None
    events: list[tuple[dt.datetime, str]] = field(default_factory=list)


def _origin(lesson: LessonInfo) -> str:
    if (lesson.metadata or {}).get("source") == LESSON_SOURCE_USER:
        return "user"
    return "episodes" if lesson.source_episode_ids or lesson.extraction_id is not None else "unknown"


def lesson_life(store: ExperienceStore, lesson: LessonInfo) -> LessonLife:
    """Everything the store knows about the lesson's life (see the module docstring)."""
    with read_session(store) as session:
        held_rows = (
            session.execute(
                select(LessonSet)
                .join(LessonSetMember, LessonSetMember.lesson_set_id == LessonSet.id)
                .where(LessonSetMember.lesson_id == lesson.id)
                .order_by(LessonSet.version)
            )
            .scalars()
            .all()
        )
        held = [HeldBy(r.version, r.status, r.made_by, r.note, r.created_at) for r in held_rows]
        versions = [h.version for h in held]
        cycles = []
        if versions:
            same_run = Cycle.run_id.is_(None) if lesson.run_id is None else Cycle.run_id == lesson.run_id
            cycles = [
                to_info(CycleInfo, r)
                for r in session.scalars(
                    select(Cycle).where(same_run, Cycle.lesson_set_version.in_(versions)).order_by(Cycle.id)
                )
            ]
        adapter_ids = {c.adapter_id for c in cycles if c.adapter_id is not None}
        forgotten = None
        if lesson.forgotten_at is not None:
            forgotten = _forgetting(session, lesson)
            adapter_ids |= (
                {i for i in (forgotten.request.payload.get("tainted_adapter_ids") or []) if isinstance(i, int)}
                if forgotten.request
                else set()
            )
            back = forgotten.request.payload.get("base_adapter_id") if forgotten.request else None
            if isinstance(back, int):
                adapter_ids.add(back)
        adapters = (
            {r.id: to_info(AdapterInfo, r) for r in session.scalars(select(Adapter).where(Adapter.id.in_(adapter_ids)))}
            if adapter_ids
            else {}
        )
        consolidated = session.get(Cycle, lesson.consolidated_cycle_id) if lesson.consolidated_cycle_id else None
        consolidated_by = to_info(CycleInfo, consolidated) if consolidated is not None else None
    taught = [
        TaughtInto(c, adapters.get(c.adapter_id) if c.adapter_id else None, c.id == lesson.consolidated_cycle_id)
        for c in cycles
    ]
    if forgotten is not None and forgotten.request is not None:
        payload = forgotten.request.payload
        forgotten.tainted = [adapters[i] for i in payload.get("tainted_adapter_ids") or [] if i in adapters]
        forgotten.back_to = adapters.get(payload.get("base_adapter_id"))
        forgotten.restored = [i for i in payload.get("restored_lessons") or [] if isinstance(i, int)]
    life = LessonLife(_origin(lesson), held, taught, consolidated_by, forgotten)
    life.events = _events(lesson, life)
    return life


def _forgetting(session, lesson: LessonInfo) -> Forgetting:
    """The forget's record: its reason (kept in the lesson's metadata), the versions whose note is that reason,
    and the reconsolidation request it left with the same reason, written in the same transaction."""
    reason = str((lesson.metadata or {}).get("forgotten") or "")
    out = Forgetting(lesson.forgotten_at, reason)
    if lesson.run_id is None or not reason:
        return out
    root = _FORGOT.match(reason)
    wrote = [LessonSet.note == reason]
    if root:  # a pending candidate written again keeps its own note, then names the forgotten lesson
        wrote.append(LessonSet.note.endswith(f"without forgotten #{root.group(1)}", autoescape=True))
    out.versions = list(
        session.scalars(
            select(LessonSet.version).where(LessonSet.run_id == lesson.run_id, or_(*wrote)).order_by(LessonSet.version)
        )
    )
    requests = [
        to_info(RequestInfo, r)
        for r in session.scalars(
            select(RunRequest)
            .where(RunRequest.run_id == lesson.run_id, RunRequest.kind == RECONSOLIDATE)
            .order_by(RunRequest.id)
        )
    ]
    matching = [r for r in requests if (r.payload or {}).get("reason") == reason]
    if matching:  # the one nearest in time: the same words may have been a later forget's too
        out.request = min(matching, key=lambda r: abs((r.created_at - lesson.forgotten_at).total_seconds()))
    return out


def _events(lesson: LessonInfo, life: LessonLife) -> list[tuple[dt.datetime, str]]:
    origin = {
        "user": "added by a person",
        "episodes": f"extracted from episodes "
        f"{', '.join(f'#{e}' for e in lesson.source_episode_ids) or '(none recorded)'}",
        "unknown": "created",
    }[life.origin]
    events = [(lesson.created_at, origin)]
    for held in life.held_by:
        by = " by a person" if held.made_by == MADE_BY_USER else ""
        events.append((held.created_at, f"in lesson set v{held.version} ({held.status}{by})"))
    for taught in life.taught_into:
        made = f", adapter {taught.adapter.name} ({taught.adapter.status})" if taught.adapter else ""
        what = f"taught into OPCD cycle {taught.cycle.id} ({taught.cycle.status}{made})"
        events.append((taught.cycle.started_at, what))
    if life.consolidated_by is not None:
        at = life.consolidated_by.ended_at or life.consolidated_by.started_at
        events.append((at, f"consolidated by OPCD cycle {life.consolidated_by.id}: it left the context"))
    if life.forgotten is not None:
        events.append((life.forgotten.at, f"forgotten ({life.forgotten.reason or 'no reason recorded'})"))
        request = life.forgotten.request
        if request is not None and request.done_at is not None:
            events.append((request.done_at, f"re-consolidation (run request #{request.id}) done"))
    return sorted(events, key=lambda e: e[0])


@dataclass
class AdapterCheck:
    """The fingerprint of the weights an episode's backend had loaded, against its adapter's recorded one."""

    adapter: AdapterInfo | None
    episode_fingerprint: str | None
    adapter_fingerprint: str | None
    state: str  # "base", "match", "mismatch", "unreported" (the backend gave none), "unrecorded" (the trainer's)

    @property
    def problem(self) -> bool:
        return self.state == "mismatch"


def adapter_check(store: ExperienceStore, episode: EpisodeInfo) -> AdapterCheck:
    """Whether the episode's backend acted with the weights its adapter row says the trainer wrote."""
    adapter = None
    if episode.adapter_id is not None:
        with read_session(store) as session:
            row = session.get(Adapter, episode.adapter_id)
            adapter = to_info(AdapterInfo, row) if row is not None else None
    ours, theirs = episode.adapter_fingerprint, adapter.fingerprint if adapter is not None else None
    if episode.adapter_id is None and ours is None:
        state = "base"
    elif ours is None:
        state = "unreported"
    elif theirs is None:
        state = "unrecorded"
    else:
        state = "match" if ours == theirs else "mismatch"
    return AdapterCheck(adapter, ours, theirs, state)


def probe_results(cycle: CycleInfo) -> list[dict[str, Any]]:
    """The adapter probe's verdicts stored with a cycle (one per backend or worker), for its page."""
    results = ((cycle.metrics or {}).get("probe") or {}).get("results") or {}
    return [dict(v, where=k) for k, v in sorted(results.items()) if isinstance(v, dict)]
