"""Forget a lesson everywhere: out of the context, and out of the weights it was consolidated into.

What: `plan_forget(store, lesson_id) -> ForgetPlan` says, writing nothing, what forgetting a lesson undoes, and
`apply_forget(store, plan)` does it in one transaction:
- the lesson and every lesson derived from it (merged or updated from it, transitively: a merge keeps both
  sources' provenance, so what was merged from a forgotten lesson is forgotten with it) leave the live set and
  a pending candidate (new versions), and are marked forgotten (status `retired`, `forgotten_at` set);
- a merge keeps the older source's text (`distill.lessons.curate`). When that source is not forgotten, the
  merged row is forgotten (it carries the forgotten lesson's provenance) but its text is not the forgotten
  lesson's: the source whose text it kept comes back as its own lesson wherever the merged row stood (live set,
  candidate), with its own provenance only, unless it was forgotten or is consolidated itself. Forgetting that
  source too removes the text;
- every adapter trained with the forgotten text in the teacher's context (its cycle distilled a lesson set
  holding the lesson, an update of it, or a merge that kept its text), and every adapter trained on top of
  such an adapter, is tainted. A merge that kept another lesson's text showed the teacher only that text, so
  it taints nothing. If the run's active adapter is tainted, the run goes back to the newest ancestor of it
  that is not (or the base model), and the tainted ones are retired;
- the lessons those tainted cycles had consolidated (taken out of the context because the weights held them)
  and that are not forgotten come back into the live set as active lessons, since the weights that held them
  are gone (for a forgotten merge among them, the source whose text it kept);
- a re-consolidation of the live lessons on top of that ancestor is scheduled as a run request, which the
  loop runs as its next CONSOLIDATE (`agent-runtime distill` runs it at once).

Why a plan first: the command prints what it would undo (versions, adapters, cycles) and asks for `--yes`
before it rolls back an adapter; the plan is also what the tests check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from distill.lessons import versions
from distill.lessons.errors import UnknownLessonError

if TYPE_CHECKING:
    from memory import AdapterInfo, CycleInfo, ExperienceStore, LessonInfo, LessonSetInfo

RECONSOLIDATE = "reconsolidate"  # the run request a forget leaves when it rolled an adapter back


@dataclass
class ForgetPlan:
    """What forgetting `lesson_id` undoes (see the module docstring)."""

    run_id: int | None
    lesson_id: int
    forgotten: list[int]  # the lesson and what was derived from it
    derived: dict[int, int] = field(default_factory=dict)  # derived lesson -> the lesson it came from
    live: LessonSetInfo | None = None  # the live version, if it holds any of them
    candidate: LessonSetInfo | None = None  # a pending candidate holding any of them
    tainted_cycles: list[CycleInfo] = field(default_factory=list)  # promoted cycles taught with one of them
    tainted_adapters: list[AdapterInfo] = field(default_factory=list)  # their adapters and their descendants
    active: AdapterInfo | None = None
    fallback: AdapterInfo | None = None  # what the run acts with afterwards, if the active adapter is tainted
    restored: list[int] = field(default_factory=list)  # lessons the tainted cycles consolidated, back in context
    kept_text: dict[int, int] = field(default_factory=dict)  # forgotten merge -> the other source whose text it kept
    back_in_place: dict[int, int] = field(default_factory=dict)  # of those, the ones whose source comes back
    kept_out: dict[int, str] = field(default_factory=dict)  # the others -> why their source does not come back

    @property
    def rolls_back(self) -> bool:
        return self.active is not None and any(a.id == self.active.id for a in self.tainted_adapters)

    def lines(self) -> list[str]:
        """What the plan undoes, for a person to read before `--yes`."""
        ids = ", ".join(f"#{i}" for i in self.forgotten)
        out = [
            f"forget lessons {ids}"
            + (f" ({', '.join(f'#{d} came from #{s}' for d, s in self.derived.items())})" if self.derived else "")
        ]
        for merged, source in self.kept_text.items():
            line = f"#{merged} was merged from #{self.derived[merged]} but shows the text of #{source}: "
            if merged in self.back_in_place:
                line += f"#{source} comes back as its own lesson in its place (forget #{source} to remove that text)"
            else:
                line += f"#{source} does not come back: {self.kept_out[merged]}"
            out.append(line)
        if self.live is not None:
            out.append(f"live set v{self.live.version} -> a new version without them")
        if self.candidate is not None:
            out.append(f"pending candidate v{self.candidate.version} -> written again without them")
        for cycle in self.tainted_cycles:
            out.append(
                f"OPCD cycle {cycle.id} was taught with them (lesson set v{cycle.lesson_set_version}); "
                f"its adapter #{cycle.adapter_id} is tainted"
            )
        descendants = [a for a in self.tainted_adapters if a.id not in {c.adapter_id for c in self.tainted_cycles}]
        for adapter in descendants:
            out.append(f"adapter #{adapter.id} {adapter.name} was trained on top of a tainted adapter")
        if self.rolls_back:
            back = f"adapter #{self.fallback.id} {self.fallback.name}" if self.fallback else "the base model"
            out.append(f"the run acts with {back} instead of adapter #{self.active.id} {self.active.name}")
            if self.restored:
                out.append(
                    "lessons the tainted cycles had consolidated come back into the context: "
                    + ", ".join(f"#{i}" for i in self.restored)
                )
            out.append(
                "a re-consolidation of the live lessons on top of it is scheduled (the loop's next "
                "CONSOLIDATE; `agent-runtime distill` runs it now)"
            )
        elif self.tainted_adapters:
            out.append("no tainted adapter is in use: nothing to roll back")
        return out


def _derived(lessons: Sequence[LessonInfo], lesson_id: int) -> dict[int, int]:
    """Lessons that descend from `lesson_id` (merged or updated from it, transitively) -> their source."""
    children: dict[int, list[int]] = {}
    for lesson in lessons:
        merged, updated = versions.predecessors(lesson)
        for parent in merged + updated:
            children.setdefault(parent, []).append(lesson.id)
    out, todo = {}, [lesson_id]
    while todo:
        parent = todo.pop()
        for child in children.get(parent, []):
            if child not in out and child != lesson_id:
                out[child] = parent
                todo.append(child)
    return out


def _text_sources(lessons: Sequence[LessonInfo], derived: dict[int, int], lesson_id: int) -> dict[int, int]:
    """Forgotten merges whose text is not the forgotten lesson's -> the not-forgotten lesson whose text they kept.
    A merge's text is that of the first source it equals (the curator keeps the older source's). An update, and a
    merge whose text equals none of its sources, carry their predecessors' content: they are not counted here."""
    rows = {x.id: x for x in lessons}
    carries = {lesson_id}  # forgotten rows whose text is (or came from) the forgotten lesson's
    kept: dict[int, int] = {}  # forgotten row -> the lesson whose text it shows
    for row_id in sorted(derived):  # a successor row is written after its predecessors
        lesson = rows[row_id]
        merged, updated = versions.predecessors(lesson)
        same = next((i for i in merged if i in rows and rows[i].text == lesson.text), None)
        if updated or same is None or same in carries:
            carries.add(row_id)
        else:
            kept[row_id] = kept.get(same, same)
    return kept


def plan_forget(store: ExperienceStore, lesson_id: int, *, run_id: int | None = None) -> ForgetPlan:
    """What forgetting `lesson_id` undoes; writes nothing. An unknown lesson (or one of another run than
    `run_id`, when given) is an `UnknownLessonError`."""
    found = store.lessons(None, ids=[lesson_id])
    if not found:
        raise UnknownLessonError(f"no lesson #{lesson_id} in {store.url}")
    lesson = found[0]
    if run_id is not None and lesson.run_id != run_id:
        raise UnknownLessonError(f"lesson #{lesson_id} belongs to run {lesson.run_id}, not run {run_id}")
    run_id = lesson.run_id
    every = store.lessons(run_id)
    derived = _derived(every, lesson_id)
    forgotten = [lesson_id, *sorted(derived)]
    gone = set(forgotten)
    live, pending = versions.live_version(store, run_id), versions.pending_candidate(store, run_id)
    plan = ForgetPlan(
        run_id,
        lesson_id,
        forgotten,
        derived,
        live=live if live is not None and gone & set(live.lesson_ids) else None,
        candidate=pending if pending is not None and gone & set(pending.lesson_ids) else None,
    )
    plan.kept_text = _text_sources(every, derived, lesson_id)
    taught_text = gone - set(plan.kept_text)  # what a teacher saw of them
    sets = {s.version: set(s.lesson_ids) for s in store.lesson_sets(run_id)}
    cycles = [c for c in store.cycles(run_id) if c.adapter_id is not None]
    plan.tainted_cycles = [
        c for c in cycles if c.status == "promoted" and taught_text & sets.get(c.lesson_set_version, set())
    ]
    adapters = {a.id: a for a in store.adapters(run_id)}
    tainted = {c.adapter_id for c in plan.tainted_cycles}
    grew = True
    while grew:  # an adapter trained on top of a tainted one is tainted (its teacher and start were)
        grew = False
        for adapter in adapters.values():
            if adapter.id not in tainted and adapter.parent_id in tainted:
                tainted.add(adapter.id)
                grew = True
    plan.tainted_adapters = [adapters[i] for i in sorted(tainted) if i in adapters]
    plan.active = store.active_adapter(run_id)
    rows = {x.id: x for x in every}
    taught = {c.id for c in cycles if c.adapter_id in tainted} if plan.rolls_back else set()
    if plan.rolls_back:
        node = plan.active
        while node is not None and node.id in tainted:
            node = adapters.get(node.parent_id) if node.parent_id is not None else None
        plan.fallback = node
    unweighted = {x.id for x in every if x.status == "consolidated" and x.consolidated_cycle_id in taught}
    in_context = _members(plan.live) | _members(plan.candidate) | unweighted
    for merged, source in plan.kept_text.items():
        kept, merge = rows[source], rows[merged]
        if kept.forgotten_at is not None:
            plan.kept_out[merged] = f"#{source} was forgotten"
        elif kept.status == "consolidated" and source not in unweighted:
            plan.kept_out[merged] = f"#{source} is consolidated into cycle {kept.consolidated_cycle_id}'s adapter"
        elif merged in in_context:
            plan.back_in_place[merged] = source
        elif merge.status == "consolidated":
            plan.kept_out[merged] = (
                f"the text stays in cycle {merge.consolidated_cycle_id}'s adapter, which consolidated #{merged}"
            )
        else:
            plan.kept_out[merged] = f"#{merged} was not in the context"
    if plan.rolls_back:
        back = [plan.back_in_place.get(i, i) for i in sorted(unweighted)]
        plan.restored = list(dict.fromkeys(i for i in back if i not in gone))
    return plan


def _members(info: LessonSetInfo | None) -> set[int]:
    return set(info.lesson_ids) if info is not None else set()


def _in_place(ids: Sequence[int], gone: set[int], back_in_place: dict[int, int]) -> list[int]:
    """`ids` without the forgotten lessons, a source whose text a forgotten merge kept standing in its place."""
    out: list[int] = []
    for i in ids:
        i = back_in_place.get(i, i)
        if i not in gone and i not in out:
            out.append(i)
    return out


def apply_forget(store: ExperienceStore, plan: ForgetPlan, *, count_tokens: Callable[[str], int]) -> dict:
    """Carry out `plan` in one transaction; returns what was written (new versions, request id)."""
    gone = set(plan.forgotten)
    note = f"forgot #{plan.lesson_id}" + (f" and what came from it ({len(plan.derived)})" if plan.derived else "")
    note += "".join(f"; #{s} back in place of #{m}" for m, s in plan.back_in_place.items())
    out: dict = {"versions": [], "request_id": None}
    with store.transaction():
        live = versions.live_version(store, plan.run_id)
        if plan.live is not None or plan.restored:
            keep = _in_place(live.lesson_ids if live else [], gone, plan.back_in_place)
            keep += [i for i in plan.restored if i not in keep]
            rows = {x.id: x for x in store.lessons(plan.run_id, ids=keep)} if keep else {}
            tokens = sum(count_tokens(rows[i].text) for i in keep)
            info = versions.create_version(store, plan.run_id, keep, by_user=True, note=note, token_count=tokens)
            out["versions"].append(info.version)
        pending = versions.pending_candidate(store, plan.run_id)
        if plan.candidate is not None and pending is not None:
            keep = _in_place(pending.lesson_ids, gone, plan.back_in_place)
            info = versions.create_version(
                store,
                plan.run_id,
                keep,
                candidate=True,
                by_user=versions.is_user_version(pending),
                note=f"{pending.note.strip()}; without forgotten #{plan.lesson_id}",
            )
            out["versions"].append(info.version)
        store.forget_lessons(plan.forgotten, reason=note)
        if plan.restored:  # in the context again: measured and consolidated again like any active lesson
            store.set_lesson_status(plan.restored, "active")
        if plan.rolls_back:
            for adapter in plan.tainted_adapters:
                if adapter.status in ("active", "candidate"):
                    store.set_adapter_status(adapter.id, "retired")
            if plan.fallback is not None:
                store.set_adapter_status(plan.fallback.id, "active")
            out["request_id"] = store.add_request(
                plan.run_id,
                RECONSOLIDATE,
                {
                    "reason": note,
                    "base_adapter_id": plan.fallback.id if plan.fallback else None,
                    "tainted_adapter_ids": [a.id for a in plan.tainted_adapters],
                    "restored_lessons": plan.restored,
                },
            )
    return out
