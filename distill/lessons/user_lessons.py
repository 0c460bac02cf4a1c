"""Lessons a person writes (`agent-runtime lessons add|retire`, `lessons.seed`), through the same screen,
curator and versions as the lessons the agent extracts.

What:
- `add_user_lessons(store, run_id, texts, settings, *, count_tokens, embedder=None, candidate=False,
  note="") -> UserAddResult`: every text is screened, checked against the budget and the lessons already
  there, recorded with provenance "user", curated into EVERY pool, and committed as one new version
  (live, or a candidate for the gate). `UserAddResult.items` says per text what happened.
- `retire_lessons(store, run_id, lesson_ids, *, count_tokens, note="") -> RetireResult`: a new live
  version without those lessons (they become "retired"); a pending candidate loses them too.
- `pending_user_candidate(store, run_id)`: a candidate a person made that awaits the gate (the EXTRACT
  phase gates it before it extracts; see `agent_runtime.phases.extract`).

How a text is handled, in order:
1. `screen_item(text, settings.max_item_chars)`, exactly as an extracted item (cleaned and capped, or
   rejected with its reason). An "UPDATE #id: ..." or "DELETE #id" is rejected too: a person retires
   a lesson with `retire_lessons` and adds the new text.
2. A text whose experience block alone exceeds `budget_tokens` is rejected: the curator would first
   evict every older lesson to make room and then drop the text itself.
3. A text repeated in the same call, or a near-duplicate of a lesson already in a pool (the curator's
   own merge rule, `LessonCurator.duplicate_of`), is reported and not added to that pool.
4. The rest are recorded as one extraction call (extractor "user", no episodes) whose lesson rows,
   one per pool, carry `metadata["source"] = "user"`, and are applied as additions: a conflicting
   lesson (similar, opposite polarity) is replaced as for extracted items, and the budget is enforced
   (lowest utility, then oldest, first), which may drop an older lesson -- or, at a later EXTRACT, this
   one. One version is committed, marked as made by a person (`versions.is_user_version`).

Why these choices: the screen and the curator are the only doors into the prompt, and a person's text
goes through them like any other (a pasted secret or an injected instruction is no better for being
pasted by hand). Provenance reuses existing columns (the extraction's `extractor` string, the lesson's
JSON metadata), so no migration is needed. Every pool gets the lesson: pools are independent samples of
extracted experience, and a person's knowledge is not a sample. A new version builds on a pending user
candidate if there is one, so two `lessons add` in a row while the gate is on are gated together.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distill.lessons import versions
from distill.lessons.curate import Change, LessonCurator, render_lessons
from distill.lessons.errors import UnknownLessonError
from distill.lessons.extractor import Proposal, parse_operation
from distill.lessons.safety import mask_credentials, replace_lone_surrogates, screen_item
from distill.lessons.scope import GLOBAL
from memory import LESSON_SOURCE_USER

if TYPE_CHECKING:
    from memory import ExperienceStore, LessonSetInfo
    from memory.embeddings import Embedder


@dataclass
class UserItem:
    """What became of one text: status added | duplicate | rejected | dropped."""

    text: str
    status: str
    reason: str = ""
    lesson_ids: list[int] = field(default_factory=list)  # the rows in the new version (one per pool)
    duplicate_of: list[int] = field(default_factory=list)
    replaced: list[int] = field(default_factory=list)  # lessons it replaced (a conflict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "status": self.status,
            "reason": self.reason,
            "lesson_ids": self.lesson_ids,
            "duplicate_of": self.duplicate_of,
            "replaced": self.replaced,
        }


@dataclass
class UserAddResult:
    """The outcome of one `add_user_lessons` call."""

    run_id: int | None
    items: list[UserItem]
    version: LessonSetInfo | None = None
    candidate: bool = False
    extraction_id: int | None = None
    changes: list[Change] = field(default_factory=list)

    @property
    def rejected(self) -> list[UserItem]:
        """Texts that did not go in for a reason the person must fix (screen, budget)."""
        return [x for x in self.items if x.status in ("rejected", "dropped")]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "version": self.version.version if self.version else None,
            "candidate": self.candidate,
            "extraction_id": self.extraction_id,
            "items": [x.to_dict() for x in self.items],
            "changes": [c.to_dict() for c in self.changes],
        }

    def lines(self) -> list[str]:
        out = []
        for item in self.items:
            if item.status == "added":
                ids = ", ".join(f"#{i}" for i in item.lesson_ids)
                replaced = f" (replaces {', '.join(f'#{i}' for i in item.replaced)})" if item.replaced else ""
                cut = f" ({item.reason})" if item.reason else ""
                out.append(f"added {ids}{replaced}{cut}: {item.text}")
            else:
                out.append(f"{item.status}: {item.text!r}: {item.reason}")
        for change in self.changes:
            if change.op == "drop":
                out.append(f"dropped #{change.target} from pool {change.pool}: {change.reason}")
        if self.version is None:
            out.append("no new lesson-set version")
        elif self.candidate:
            out.append(f"lesson set v{self.version.version} is a candidate: the loop gates it before it plays")
        else:
            out.append(f"lesson set v{self.version.version} is live")
        return out


def pending_user_candidate(store: ExperienceStore, run_id: int | None) -> LessonSetInfo | None:
    """The pending candidate if a person made it (it awaits the gate), else None."""
    pending = versions.pending_candidate(store, run_id)
    return pending if pending is not None and versions.is_user_version(pending) else None


def _normal(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def _screen(texts: Sequence[str], settings: Any, count_tokens: Callable[[str], int]) -> list[UserItem]:
    """Per text: the cleaned text to add (status "added" so far), or why not (steps 1-3 of the module doc)."""
    out: list[UserItem] = []
    seen: dict[str, int] = {}
    for i, text in enumerate(texts):
        preview = mask_credentials(re.sub(r"\s+", " ", replace_lone_surrogates(text)).strip())[:200]  # storable text
        verdict = screen_item(text, settings.max_item_chars)
        if verdict.text is None:
            out.append(UserItem(preview, "rejected", verdict.reason or "rejected by the safety screen"))
            continue
        cleaned = verdict.text
        if parse_operation(cleaned).op != "add":
            out.append(
                UserItem(
                    preview, "rejected", "an UPDATE/DELETE instruction: retire the lesson and add the new text instead"
                )
            )
            continue
        tokens = count_tokens(render_lessons([cleaned]))
        if tokens > settings.budget_tokens:
            out.append(
                UserItem(
                    cleaned,
                    "rejected",
                    f"over budget: {tokens} tokens alone exceed lessons.budget_tokens={settings.budget_tokens}",
                )
            )
            continue
        if _normal(cleaned) in seen:
            out.append(UserItem(cleaned, "duplicate", f"repeats text {seen[_normal(cleaned)] + 1} of this call"))
            continue
        seen[_normal(cleaned)] = i
        out.append(
            UserItem(cleaned, "added", f"cut to {settings.max_item_chars} characters" if verdict.truncated else "")
        )
    return out


def add_user_lessons(
    store: ExperienceStore,
    run_id: int | None,
    texts: Sequence[str],
    settings: Any,
    *,
    count_tokens: Callable[[str], int],
    embedder: Embedder | None = None,
    candidate: bool = False,
    note: str = "",
    scope: Sequence[str] = GLOBAL,
) -> UserAddResult:
    """Screen, record, curate into every pool and version the texts a person wrote (see module doc). `scope`: the
    environments they are proposed for (`distill.lessons.scope`; a gated run tries them in each)."""
    curator = LessonCurator.from_settings(store, run_id, settings, count_tokens=count_tokens, embedder=embedder)
    pending = pending_user_candidate(store, run_id)
    curator.begin(pending.version if pending is not None else None)
    items = _screen(texts, settings, count_tokens)
    specs: list[dict[str, Any]] = []
    for item in items:
        if item.status != "added":
            continue
        for pool in range(curator.pools):
            found = curator.duplicate_of(item.text, pool, scope)
            if found is None:
                specs.append(
                    {
                        "text": item.text,
                        "pool": pool,
                        "scope": list(scope),
                        "token_count": count_tokens(item.text),
                        "metadata": {"source": LESSON_SOURCE_USER, "proposed_scope": list(scope)},
                    }
                )
            else:
                item.duplicate_of.append(found[0].id)
        if len(item.duplicate_of) == curator.pools:
            ids = ", ".join(f"#{i}" for i in item.duplicate_of)
            item.status, item.reason = "duplicate", f"already in the lessons as {ids}"
    result = UserAddResult(run_id, items, candidate=candidate)
    if not specs:
        return result
    added = [x for x in items if x.status == "added"]
    extraction_id, lesson_ids = store.record_extraction(
        LESSON_SOURCE_USER,
        specs,
        run_id=run_id,
        episode_ids=[],
        response="\n".join(x.text for x in added),
        metadata={
            "source": LESSON_SOURCE_USER,
            "items": [x.text for x in added],
            "rejected": [{"text": x.text, "reason": x.reason} for x in items if x.status == "rejected"],
            "duplicates": [x.text for x in items if x.status == "duplicate"],
        },
    )
    result.extraction_id = extraction_id
    decided: list[int] = []  # per spec: where its decision is in result.changes
    for spec, lesson_id in zip(specs, lesson_ids):
        proposal = Proposal("add", spec["text"], spec["pool"], extraction_id, (), lesson_id=lesson_id)
        decided.append(len(result.changes))
        result.changes += curator.apply([proposal])
    committed = curator.commit(candidate=candidate, by_user=True, note=note)
    result.version = committed.version
    final = set(committed.version.lesson_ids) if committed.version else set()
    by_text = {x.text: x for x in added}
    dropped: dict[str, str] = {}
    for spec, at in zip(specs, decided):
        item = by_text[spec["text"]]
        decision = result.changes[at]
        if decision.op == "update" and decision.target is not None:
            item.replaced.append(decision.target)
        kept, reason = _follow(decision, result.changes[at + 1 :], final)
        if kept is not None:
            item.lesson_ids.append(kept)
        else:
            dropped[item.text] = reason
    for item in added:
        if not item.lesson_ids:
            item.status, item.reason = "dropped", dropped.get(item.text, "not kept by the curator")
    return result


def _follow(decision: Change, later: Sequence[Change], final: set[int]) -> tuple[int | None, str]:
    """Follow one row through the round's later changes (merged into, replaced, dropped) to the version:
    (the row that holds it there, or None and why not)."""
    current, reason = decision.lesson_id, ""
    for change in later:
        if current is None:
            break
        if change.target == current and change.pool == decision.pool:
            current, reason = (change.lesson_id if change.op in ("merge", "update") else None), change.reason
    if current is None or current not in final:
        return None, reason or "not kept by the curator"
    return current, ""


@dataclass
class RetireResult:
    run_id: int | None
    retired: list[int]
    live: LessonSetInfo | None  # the new live version (None if no retired lesson was live)
    candidate: LessonSetInfo | None  # the re-made pending candidate, if there was one

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "retired": self.retired,
            "live_version": self.live.version if self.live else None,
            "candidate_version": self.candidate.version if self.candidate else None,
        }

    def lines(self) -> list[str]:
        ids = ", ".join(f"#{i}" for i in self.retired)
        out = [f"run {self.run_id}: retired {ids}"]
        if self.live is not None:
            out.append(f"lesson set v{self.live.version} is live without them")
        if self.candidate is not None:
            out.append(f"pending candidate re-made without them as v{self.candidate.version}")
        return out


def _token_count(
    store: ExperienceStore, run_id: int | None, ids: Sequence[int], count_tokens: Callable[[str], int]
) -> int:
    """Tokens of the largest pool's experience block (what a version records, as `LessonCurator.commit`)."""
    if not ids:
        return 0
    rows = {x.id: x for x in store.lessons(run_id, ids=ids)}
    pools: dict[int, list[str]] = {}
    for i in ids:
        pools.setdefault(rows[i].pool, []).append(rows[i].text)
    return max(count_tokens(render_lessons(texts)) for texts in pools.values())


def retire_lessons(
    store: ExperienceStore,
    run_id: int | None,
    lesson_ids: Sequence[int],
    *,
    count_tokens: Callable[[str], int],
    note: str = "",
) -> RetireResult:
    """Take lessons out of the live set (and of a pending candidate). Every id is checked before anything
    is written: an unknown id, a lesson of another run, or one in neither set is an `UnknownLessonError`."""
    live = versions.live_version(store, run_id)
    pending = versions.pending_candidate(store, run_id)
    live_ids = list(live.lesson_ids) if live else []
    pending_ids = list(pending.lesson_ids) if pending else []
    wanted = list(dict.fromkeys(lesson_ids))
    found = {x.id: x for x in store.lessons(None, ids=wanted)} if wanted else {}
    for lesson_id in wanted:
        lesson = found.get(lesson_id)
        shown = ", ".join(f"#{i}" for i in live_ids) or "none"
        if lesson is None:
            raise UnknownLessonError(
                f"no lesson #{lesson_id} in {store.url}; the live lessons of run {run_id}: {shown}"
            )
        if lesson.run_id != run_id:
            raise UnknownLessonError(
                f"lesson #{lesson_id} belongs to run {lesson.run_id}, not run {run_id}; pass --run {lesson.run_id}"
            )
        if lesson_id not in live_ids and lesson_id not in pending_ids:
            raise UnknownLessonError(
                f"lesson #{lesson_id} of run {run_id} is not in the live set (status "
                f"{lesson.status}); the live lessons: {shown}"
            )
    ids = ", ".join(f"#{i}" for i in wanted)
    text = f"retired {ids}" + (f"; {note}" if note else "")
    new_live = None
    if live is not None and set(wanted) & set(live_ids):
        keep = [i for i in live_ids if i not in wanted]
        new_live = versions.create_version(
            store, run_id, keep, by_user=True, note=text, token_count=_token_count(store, run_id, keep, count_tokens)
        )
    new_candidate = None
    if pending is not None:
        # a new live version would make the candidate stale: write it again, as the newest version
        keep = [i for i in pending_ids if i not in wanted]
        kept_note = pending.note.strip() + f"; without retired {ids}"
        new_candidate = versions.create_version(
            store,
            run_id,
            keep,
            candidate=True,
            note=kept_note,
            by_user=versions.is_user_version(pending),
            token_count=_token_count(store, run_id, keep, count_tokens),
        )
    return RetireResult(run_id, wanted, new_live, new_candidate)
