"""How much of what the extractor writes survives: items past the screen, lessons that reached the prompt.

What: `extraction_stats(store, run_id, *, contrastive=None) -> ExtractionStats`, over the run's
extraction calls (a person's `lessons add` calls are left out), or only the contrastive ones
(`contrastive=True`) or only the single-trajectory ones (`False`):
- calls: `extractions`, `empty` (nothing parseable), `contrastive`;
- items: `items` that passed the safety screen (and `max_items`), `rejected` with `rejected_by_reason`;
- lessons (the rows those items became, DELETEs make none; rows the curator wrote as successors are not
  counted again): `lessons`, of which `live` (its text reached a live version: the row itself, or a
  successor that kept its text -- a merge keeps the older lesson's, a conflict carries the newer one's),
  `merged` (a near-duplicate absorbed into a lesson that went live: its provenance reached the prompt,
  its wording did not), and `never_live` (blocked by the gate, dropped by the budget, or still pending);
- the gate's decisions on the run's candidates: `gate_promoted`, `gate_blocked` (all calls together: a
  candidate mixes the items of a whole phase).

Why a function: every number is in the store (the extraction's metadata keeps its items and rejections,
versions list their lessons, gate decisions are evaluation rows), but following a lesson through merges
within one curation round to the version that held it is easy to get wrong in a study script.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from memory import EVALUATION_GATE, LESSON_SET_LIVE, LESSON_SOURCE_USER

if TYPE_CHECKING:
    from memory import ExperienceStore


@dataclass
class ExtractionStats:
    extractions: int = 0
    empty: int = 0
    contrastive: int = 0
    items: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    lessons: int = 0
    live: int = 0
    merged: int = 0
    never_live: int = 0
    gate_promoted: int = 0
    gate_blocked: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def extraction_stats(store: ExperienceStore, run_id: int, *, contrastive: bool | None = None) -> ExtractionStats:
    """Counts of what the run's extractions produced and what reached the prompt (see module doc)."""
    calls = [
        x
        for x in store.extractions(run_id, limit=2**31 - 1)
        if x.metadata.get("source") != LESSON_SOURCE_USER
        and (contrastive is None or ("contrast" in x.metadata) == contrastive)
    ]
    stats = ExtractionStats(extractions=len(calls))
    reasons: Counter[str] = Counter()
    for call in calls:
        stats.empty += bool(call.metadata.get("empty"))
        stats.contrastive += "contrast" in call.metadata
        stats.items += len(call.metadata.get("items", []))
        rejected = call.metadata.get("rejected", [])
        stats.rejected += len(rejected)
        reasons.update(r.get("reason", "rejected") for r in rejected)
    stats.rejected_by_reason = dict(reasons)

    lessons = store.lessons(run_id)
    live_ids = {i for v in store.lesson_sets(run_id, status=LESSON_SET_LIVE) for i in v.lesson_ids}
    children: dict[int, list[tuple[str, int]]] = {}  # row -> (relation, successor row) written by the curator
    for lesson in lessons:
        # a merge keeps the first lesson's text and absorbs the second; a conflict carries the new text on
        for i, parent in enumerate(lesson.metadata.get("merged_from", [])):
            children.setdefault(int(parent), []).append(("carried" if i == 0 else "merged", lesson.id))
        if lesson.metadata.get("proposed_as") is not None:
            children.setdefault(int(lesson.metadata["proposed_as"]), []).append(("carried", lesson.id))
    wanted = {x.id for x in calls}
    for lesson in lessons:
        successor = "merged_from" in lesson.metadata or "replaces" in lesson.metadata
        if lesson.extraction_id not in wanted or successor:  # count what the extractor proposed, once
            continue
        stats.lessons += 1
        fate = _fate(lesson.id, live_ids, children)
        setattr(stats, fate, getattr(stats, fate) + 1)

    for evaluation in store.evaluations(run_id, kind=EVALUATION_GATE):
        promoted = bool(evaluation.metrics.get("promote"))
        stats.gate_promoted += promoted
        stats.gate_blocked += not promoted
    return stats


def _fate(lesson_id: int, live_ids: set[int], children: dict[int, list[tuple[str, int]]]) -> str:
    """The fate of one proposed row: live, merged or never_live. Whether the row, or a row descended from
    it, was ever live; the first hop says whether its own text went on ("carried") or only its provenance."""
    if lesson_id in live_ids:
        return "live"
    todo = list(children.get(lesson_id, []))
    seen = {lesson_id}
    while todo:
        relation, child = todo.pop(0)
        if child in seen:
            continue
        seen.add(child)
        if child in live_ids:
            return "live" if relation == "carried" else "merged"
        todo += [(relation, grandchild) for _, grandchild in children.get(child, [])]
    return "never_live"
