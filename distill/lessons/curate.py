"""`LessonCurator`: add, merge, update or delete lessons per pool, then cut each pool to a token budget.

What:
- `render_lessons(texts) -> str`: the lesson block exactly as it enters a prompt ("Lessons from your past
  experience:" and one "- " line per lesson, each screened again: `safety.prompt_lessons`; "" for no lessons). The
  one rendering: the agent's system prompt (`agent_runtime.episode.prompt`), the OPCD teacher's context and every
  budget (here, and `distill.lessons.budget` for what one episode shows) use this text.
- `LessonCurator(store, run_id, *, count_tokens, embedder=None, budget_tokens=256, pools=1, seed=1,
  merge_threshold=0.9, conflict_threshold=0.75, utilities=None)`; `from_settings(...)` builds one from
  `LessonsConfig`. A round is `begin()` (working sets from the live version), any number of
  `apply(proposals)` (from `distill.lessons.extractor.record_extraction`), `working(pool)` (what the
  extractor is shown), and `commit(candidate=...) -> CurationResult` (one new version, or none if
  nothing changed). `duplicate_of(text, pool)` says whether an item would merge into a working lesson
  (`agent-runtime lessons add` skips those). `live_lessons(pool)`, `restore(version)`,
  `promote(version)`, `reject(version)`, `diff(v1, v2)` wrap `distill.lessons.versions`.
  `pool_seed(pool)` is `seed + pool` (`seed` is `LessonsConfig.pool_seed`).

How each proposal is decided (the documented rule):
1. "DELETE #id": the lesson leaves its pool (ignored, and logged, if it is not in that pool).
2. "UPDATE #id: text": the new text replaces the lesson (appended as the newest item); unknown ids
   fall through to 3.
3. An addition is compared with every lesson of its pool by cosine similarity of embeddings, and
   the most similar lesson (an identical text, ignoring case and punctuation, or one the addition only
   restates, `restates`: its sentences are parts of that lesson's sentences, comes first) decides:
   - at `conflict_threshold` or above with opposite polarity (exactly one of the two has a negation:
     not/never/no/avoid/don't/...): a CONFLICT -- the newer item replaces it, as a new row appended
     at the end whose metadata names the lesson it `replaces`;
   - at `merge_threshold` or above, identical or restated: a NEAR-DUPLICATE -- both merge into a new lesson
     row that keeps the existing text and position and the union of both provenances (source
     episodes; `merged_from` and `extraction_ids` in its metadata);
   - otherwise the item is ADDED at the end.
   Only lessons whose scope covers the addition's (`distill.lessons.scope`: the same, a wider one, or every
   environment) are compared: a lesson of another environment is never merged into or mistaken for a duplicate of
   this one, and a conflict replaces only a lesson of the same scope.
4. After each proposal each scope's lessons in the pool are cut to `budget_tokens`, counted with
   `count_tokens` on their `render_lessons` -- exactly, so a scope's budget is never exceeded -- by dropping
   the lesson with the lowest utility first (measured utility from `distill.lessons.gate`, 0 when unknown; a
   merged lesson inherits the best of its predecessors'), then the oldest (lowest position).

A forgotten lesson (`agent-runtime lessons forget`) never comes back: a round's working pools leave it out even when
they start from a version that held it, and an addition or update that is identical to it or only restates it is
skipped ("restates forgotten #id"), so nothing merges into it or brings its text back under another id.

Why: lessons enter every prompt, so the set must stay small and non-redundant; contradictions are
resolved in favour of newer evidence (the gate catches a newer item that is wrong); merging keeps the
old wording and position so the prompt prefix (and its KV cache) stays stable. Pools are independent:
each has its own working set and budget, and the phase gives each its own episode order (its seed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from distill.lessons import versions
from distill.lessons.extractor import Proposal
from distill.lessons.safety import prompt_lessons
from distill.lessons.scope import GLOBAL, is_global

if TYPE_CHECKING:
    from memory import ExperienceStore, LessonInfo, LessonSetInfo
    from memory.embeddings import Embedder

HEADER = "Lessons from your past experience:"
_NEGATION = re.compile(
    r"\b(?:not|no|never|avoid|avoids|avoiding|without|cannot|nor|neither|none|nothing|stop|"
    r"refrain|don't|dont|doesn't|shouldn't|mustn't|won't|can't|isn't|aren't|never)\b|n't\b",
    re.IGNORECASE,
)
_NORMAL = re.compile(r"\W+")


def render_lessons(texts: Iterable[str]) -> str:
    """The lesson block as it enters a prompt (a lesson the screen now rejects is left out, logged); the empty
    string when no lesson is left."""
    shown = prompt_lessons(texts)
    if not shown:
        return ""
    return HEADER + "\n" + "\n".join(f"- {t}" for t in shown)


def same_scope(a: LessonInfo, b: LessonInfo) -> bool:
    return tuple(a.scope) == tuple(b.scope)


def covers(wide: Sequence[str], narrow: Sequence[str]) -> bool:
    """Whether a lesson of scope `wide` is in every prompt one of scope `narrow` would enter (so that saying the
    same thing twice there is a duplicate)."""
    return is_global(wide) or set(narrow) <= set(wide)


def has_negation(text: str) -> bool:
    """Whether the text states something negatively (a crude polarity for conflict detection)."""
    return bool(_NEGATION.search(text.replace("’", "'")))


def _normal(text: str) -> str:
    return _NORMAL.sub(" ", text.lower()).strip()


_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


def _words(sentence: str) -> list[str]:
    """Lower-case words, a final "s" dropped from the longer ones: "helps" and "help" are one word."""
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in _normal(sentence).split()]


def _in_order(part: list[str], whole: list[str]) -> bool:
    rest = iter(whole)
    return all(word in rest for word in part)


def restates(text: str, lesson: str) -> bool:
    """Whether `text` says nothing that `lesson` does not: each of its sentences is part of one sentence of `lesson`
    (its words there, in the same order, others allowed between them) with the same polarity. "Look never helps."
    restates "Look and inventory never help."; "When you see a coin, take coin." restates itself inside a longer
    lesson; "Never go." restates nothing in "Go through the exit." (the polarity differs), nor "Go first." (a word
    that is not there)."""
    ours = [s for s in _SENTENCE_END.split(text.strip()) if _words(s)]
    theirs = [(_words(s), has_negation(s)) for s in _SENTENCE_END.split(lesson.strip()) if _words(s)]
    return bool(ours) and all(
        any(negated == has_negation(s) and _in_order(_words(s), words) for words, negated in theirs) for s in ours
    )


@dataclass(frozen=True)
class Change:
    """One curation decision: op is add | merge | update | delete | drop | skip."""

    op: str
    pool: int
    lesson_id: int | None  # the lesson now in the pool (None for delete/drop/skip)
    target: int | None  # the lesson merged into, replaced, deleted or dropped
    similarity: float | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "pool": self.pool,
            "lesson_id": self.lesson_id,
            "target": self.target,
            "similarity": self.similarity,
            "reason": self.reason,
        }


@dataclass
class CurationResult:
    """A committed round: the new version (None if nothing changed), its changes, tokens per pool."""

    version: LessonSetInfo | None
    changes: list[Change] = field(default_factory=list)
    tokens: dict[int, int] = field(default_factory=dict)


class LessonCurator:
    """Curates the lesson pools of one run (see module docstring for the rules)."""

    def __init__(
        self,
        store: ExperienceStore,
        run_id: int | None,
        *,
        count_tokens: Callable[[str], int],
        embedder: Embedder | None = None,
        budget_tokens: int = 256,
        pools: int = 1,
        seed: int = 1,
        merge_threshold: float = 0.9,
        conflict_threshold: float = 0.75,
        utilities: Mapping[int, float] | None = None,
    ) -> None:
        assert pools >= 1, f"pools must be at least 1, got {pools}"
        assert budget_tokens >= 0, f"budget_tokens must be non-negative, got {budget_tokens}"
        self.store = store
        self.run_id = run_id
        self.count_tokens = count_tokens
        self.embedder = embedder if embedder is not None else store.embedder
        self.budget_tokens = budget_tokens
        self.pools = pools
        self.seed = seed
        self.merge_threshold = merge_threshold
        self.conflict_threshold = conflict_threshold
        self.utilities: dict[int, float] = dict(utilities or {})
        self._vectors: dict[str, np.ndarray] = {}
        self._work: dict[int, list[LessonInfo]] | None = None
        self._base: LessonSetInfo | None = None
        self._changes: list[Change] = []
        self._created: list[int] = []
        self._forgotten: list[LessonInfo] = []

    @classmethod
    def from_settings(
        cls,
        store: ExperienceStore,
        run_id: int | None,
        settings: Any,
        *,
        count_tokens: Callable[[str], int],
        embedder: Embedder | None = None,
        utilities: Mapping[int, float] | None = None,
    ) -> LessonCurator:
        """A curator configured by a `LessonsConfig` (its `embedder` spec is used if none is given)."""
        if embedder is None and settings.embedder:
            from memory.embeddings import make_embedder

            embedder = make_embedder(settings.embedder)
        return cls(
            store,
            run_id,
            count_tokens=count_tokens,
            embedder=embedder,
            budget_tokens=settings.budget_tokens,
            pools=settings.pools,
            seed=settings.pool_seed,
            merge_threshold=settings.merge_threshold,
            conflict_threshold=settings.conflict_threshold,
            utilities=utilities,
        )

    # -- reading ---------------------------------------------------------------------------------

    def pool_seed(self, pool: int) -> int:
        return self.seed + pool

    def live_version(self) -> LessonSetInfo | None:
        return versions.live_version(self.store, self.run_id)

    def _members(self, info: LessonSetInfo | None) -> dict[int, list[LessonInfo]]:
        pools: dict[int, list[LessonInfo]] = {p: [] for p in range(self.pools)}
        if info is None or not info.lesson_ids:
            return pools
        rows = {x.id: x for x in self.store.lessons(self.run_id, ids=info.lesson_ids)}
        for lesson_id in info.lesson_ids:
            lesson = rows[lesson_id]
            if lesson.forgotten_at is None:  # an old version may hold a lesson forgotten since: it stays out
                pools.setdefault(lesson.pool, []).append(lesson)
        return pools

    def live_lessons(self, pool: int | None = None) -> list[LessonInfo]:
        """The lessons in context now, in order (of one pool, or of all pools)."""
        return versions.live_lessons(self.store, self.run_id, pool)[1]

    def working(self, pool: int) -> list[LessonInfo]:
        """The pool's lessons as the current round has them (what the extractor is shown)."""
        assert self._work is not None, "call begin() before working()"
        return list(self._work.get(pool, []))

    # -- a round ---------------------------------------------------------------------------------

    def begin(self, base_version: int | None = None) -> None:
        """Start a round from `base_version` (default: the live version)."""
        if base_version is None:
            self._base = self.live_version()
        else:
            self._base = versions.get_version(self.store, self.run_id, base_version)
        self._work = self._members(self._base)
        self._changes = []
        self._created = []
        self._forgotten = [x for x in self.store.lessons(self.run_id, status="retired") if x.forgotten_at is not None]

    def _vector(self, text: str) -> np.ndarray:
        if text not in self._vectors:
            self._vectors[text] = self.embedder.embed([text])[0]
        return self._vectors[text]

    def _embed_all(self, texts: Sequence[str]) -> None:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            for text, vector in zip(missing, self.embedder.embed(missing)):
                self._vectors[text] = vector

    def _known_utility(self, lesson: LessonInfo) -> float | None:
        keys = [lesson.id] + [int(i) for i in lesson.metadata.get("merged_from", [])]
        known = [self.utilities[k] for k in keys if k in self.utilities]
        return max(known) if known else None

    def utility(self, lesson: LessonInfo) -> float:
        """Measured utility of a lesson (a merged lesson: the best of its own and its predecessors'),
        0.0 when unknown."""
        known = self._known_utility(lesson)
        return 0.0 if known is None else known

    def apply(self, proposals: Sequence[Proposal]) -> list[Change]:
        """Apply proposals in order to the working pools; returns the changes they made."""
        assert self._work is not None, "call begin() before apply()"
        pools = {p.pool for p in proposals}
        # One embedding call for the whole batch: a model call costs far more per call than per text.
        self._embed_all(
            [p.text for p in proposals if p.op != "delete"]
            + [x.text for pool in pools for x in self._work.get(pool, [])]
        )
        made: list[Change] = []
        for proposal in proposals:
            pool = self._work.setdefault(proposal.pool, [])
            made += self._decide(proposal, pool)
            made += self.enforce_budget(proposal.pool)
        self._changes += made
        return made

    def _position(self, pool: list[LessonInfo], lesson_id: int | None) -> int | None:
        for i, lesson in enumerate(pool):
            if lesson.id == lesson_id:
                return i
        return None

    def _decide(self, proposal: Proposal, pool: list[LessonInfo]) -> list[Change]:
        p = proposal.pool
        if proposal.lesson_id is not None:
            self._created.append(proposal.lesson_id)
        at = self._position(pool, proposal.target)
        if proposal.op == "delete":
            if at is None:
                return [Change("skip", p, None, proposal.target, reason="DELETE of a lesson not in the pool")]
            pool.pop(at)
            return [Change("delete", p, None, proposal.target, reason="DELETE instruction")]
        assert proposal.lesson_id is not None, "an add/update proposal carries its lesson row"
        new = self.store.get_lesson(proposal.lesson_id)
        gone = next(
            (x for x in self._forgotten if _normal(x.text) == _normal(new.text) or restates(new.text, x.text)), None
        )
        if gone is not None:
            return [Change("skip", p, None, proposal.target, reason=f"restates forgotten #{gone.id}")]
        if proposal.op == "update" and at is not None:
            pool.pop(at)
            pool.append(new)
            return [Change("update", p, new.id, proposal.target, reason="UPDATE instruction")]
        peers = [i for i, x in enumerate(pool) if covers(x.scope, new.scope)]  # only where this one would act
        if not peers:
            reason = "empty pool" if not pool else "no lesson of its scope"
            pool.append(new)
            return [Change("add", p, new.id, None, reason=reason)]
        nearest, similarity, identical = self._nearest(new.text, [pool[i] for i in peers])
        best = peers[nearest]
        opposite = has_negation(pool[best].text) != has_negation(new.text)
        # a conflict replaces the older lesson, so only one of the same scope (a wider one serves other places too)
        if not identical and opposite and similarity >= self.conflict_threshold and same_scope(pool[best], new):
            old = pool.pop(best)
            # A new row that names what it replaces, so diffs and provenance show the correction.
            replacement = self._write(
                new.text, new, new.source_episode_ids, proposal, {"replaces": old.id, "proposed_as": new.id}
            )
            pool.append(replacement)
            return [Change("update", p, replacement.id, old.id, similarity, "conflict: opposite polarity")]
        if identical or similarity >= self.merge_threshold:
            old = pool[best]
            pool[best] = self._merge(old, new, proposal)
            return [Change("merge", p, pool[best].id, old.id, similarity, f"merged #{new.id}")]
        pool.append(new)
        return [Change("add", p, new.id, None, similarity, "new")]

    def _nearest(self, text: str, pool: list[LessonInfo]) -> tuple[int, float, bool]:
        """(position, cosine, identical) of the pool's lesson closest to `text`; an identical text (ignoring
        case and punctuation) or one that `text` only restates comes first. The pool must not be empty."""
        self._embed_all([text] + [x.text for x in pool])
        sims = np.array([float(self._vector(text) @ self._vector(x.text)) for x in pool])
        identical = [i for i, x in enumerate(pool) if _normal(x.text) == _normal(text) or restates(text, x.text)]
        best = identical[0] if identical else int(np.argmax(sims))
        return best, float(sims[best]), bool(identical)

    def duplicate_of(self, text: str, pool: int, scope: Sequence[str] = GLOBAL) -> tuple[LessonInfo, float] | None:
        """The working lesson whose scope covers `scope` that `text` would be merged into by `apply` (identical, or
        at least `merge_threshold` similar without opposite polarity), with the similarity; None if it is new."""
        assert self._work is not None, "call begin() before duplicate_of()"
        members = [x for x in self._work.get(pool, []) if covers(x.scope, scope)]
        if not members:
            return None
        best, similarity, identical = self._nearest(text, members)
        opposite = has_negation(members[best].text) != has_negation(text)
        if identical or (similarity >= self.merge_threshold and not opposite):
            return members[best], similarity
        return None

    def _merge(self, old: LessonInfo, new: LessonInfo, proposal: Proposal) -> LessonInfo:
        """A new row: the old text and position, both provenances."""
        sources = list(dict.fromkeys([*old.source_episode_ids, *new.source_episode_ids]))
        extraction_ids = [
            *old.metadata.get("extraction_ids", [old.extraction_id]),
            new.extraction_id,
        ]
        metadata = {
            "merged_from": [old.id, new.id],
            "merged_texts": [new.text],
            "extraction_ids": [i for i in dict.fromkeys(extraction_ids) if i is not None],
        }
        merged = self._write(old.text, old, sources, proposal, metadata)
        inherited = self._known_utility(old)
        if inherited is not None:
            self.utilities[merged.id] = inherited
        return merged

    def _write(
        self,
        text: str,
        like: LessonInfo,
        sources: Sequence[int],
        proposal: Proposal,
        metadata: dict[str, Any],
    ) -> LessonInfo:
        """Write a successor lesson row (status "proposed" until a version makes it live)."""
        lesson_id = self.store.add_lesson(
            text,
            run_id=self.run_id,
            status="proposed",
            pool=like.pool,
            env_id=like.env_id,
            source_episode_ids=sources,
            extraction_id=proposal.extraction_id,
            token_count=like.token_count if text == like.text else self.count_tokens(text),
            metadata=metadata,
            scope=like.scope,
        )
        self._created.append(lesson_id)
        return self.store.get_lesson(lesson_id)

    def tokens(self, pool: int) -> int:
        """Tokens of the pool's rendered experience block (as the budget counts them)."""
        assert self._work is not None, "call begin() before tokens()"
        return self.count_tokens(render_lessons(x.text for x in self._work.get(pool, [])))

    def _over_budget(self, pool: list[LessonInfo]) -> tuple[str, ...] | None:
        """A scope whose lessons in `pool` render to more than the budget, or None."""
        for scope in dict.fromkeys(tuple(x.scope) for x in pool):
            texts = [x.text for x in pool if tuple(x.scope) == scope]
            if self.count_tokens(render_lessons(texts)) > self.budget_tokens:
                return scope
        return None

    def enforce_budget(self, pool_index: int) -> list[Change]:
        """Cut a working pool so that each scope's lessons fit the budget (lowest utility, then oldest, first);
        returns the drops. Each scope has a budget of its own: a new environment's lessons never push out an
        earlier one's (an episode whose scopes together hold more gets the most relevant, `LessonContexts`)."""
        assert self._work is not None, "call begin() before enforce_budget()"
        pool = self._work[pool_index]
        dropped = []
        while (scope := self._over_budget(pool)) is not None:
            members = [i for i, x in enumerate(pool) if tuple(x.scope) == scope]
            victim = min(members, key=lambda i: (self.utility(pool[i]), i))
            lesson = pool.pop(victim)
            dropped.append(
                Change(
                    "drop",
                    pool_index,
                    None,
                    lesson.id,
                    reason=f"budget {self.budget_tokens} tokens (utility {self.utility(lesson):+.2f})",
                )
            )
        return dropped

    def commit(self, *, candidate: bool = False, by_user: bool = False, note: str = "") -> CurationResult:
        """Write the round's working pools as one new version (a candidate for the gate, or live; made by
        a person if `by_user`).

        Returns a result whose `version` is None when the pools equal the base version (no change).
        The version's `token_count` is that of its largest pool (one pool enters a prompt). The note is
        the changes per pool, then `note`.
        """
        assert self._work is not None, "call begin() before commit()"
        ids = [x.id for p in sorted(self._work) for x in self._work[p]]
        tokens = {p: self.tokens(p) for p in sorted(self._work)}
        changes = list(self._changes)
        base_ids = self._base.lesson_ids if self._base is not None else []
        if ids == base_ids:
            if self._created:
                versions.sync_statuses(self.store, self.run_id)
            self.begin(self._base.version if self._base is not None else None)
            return CurationResult(None, changes, tokens)
        summary = summarize(changes)
        text = "; ".join(x for x in (summary, note) if x)
        info = versions.create_version(
            self.store,
            self.run_id,
            ids,
            candidate=candidate,
            by_user=by_user,
            note=text,
            token_count=max(tokens.values(), default=0),
        )
        self.begin(info.version)
        return CurationResult(info, changes, tokens)

    # -- versions ----------------------------------------------------------------------------------

    def restore(self, version: int, *, note: str = "") -> LessonSetInfo:
        """Make `version`'s lessons live again (a new version); see `versions.restore_version`."""
        return versions.restore_version(self.store, self.run_id, version, note=note)

    def promote(self, version: int, *, note: str = "") -> LessonSetInfo:
        return versions.promote_candidate(self.store, self.run_id, version, note=note)

    def reject(self, version: int, *, note: str = "") -> LessonSetInfo | None:
        return versions.reject_candidate(self.store, self.run_id, version, note=note)

    def diff(self, old: int, new: int) -> versions.LessonSetDiff:
        return versions.diff_versions(self.store, self.run_id, old, new)


def summarize(changes: Sequence[Change]) -> str:
    """A one-line account of a round's changes, per pool (the version note)."""
    parts = []
    for pool in sorted({c.pool for c in changes}):
        counts: dict[str, int] = {}
        for change in changes:
            if change.pool == pool:
                counts[change.op] = counts.get(change.op, 0) + 1
        shown = ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))
        parts.append(f"pool {pool}: {shown}")
    return "; ".join(parts)
