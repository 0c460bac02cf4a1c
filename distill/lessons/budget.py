"""`LessonBudget`: which of the lessons in scope for an episode its prompt shows -- the one selection that PLAY, the
held-out evaluations (`eval`, a curriculum's assessment, a cycle's EVALUATE), the gate's trials and the OPCD
teacher's context all make, so that the agent is measured and judged with the prompt it acts with.

What:
- `LessonBudget(budget_tokens=None, max_lessons=0, count_tokens=words, store=None)`; `from_settings(settings,
  count_tokens, store)` from a `LessonsConfig` (`budget_tokens`, `context_lessons`).
- `fits(texts)`: whether the lesson block of `texts` (`render_lessons`, the very text the prompt holds, counted with
  the acting model's tokenizer) is within `budget_tokens` and there are at most `max_lessons` (0: any number).
- `select(lessons, env_id, goal, observation)`: the lessons (`ScopedLesson`s already in scope for `env_id`) an
  episode of that environment, goal and first observation shows.

How `select` chooses: a lesson the prompt screen rejects is left out (it never reaches the prompt,
`render_lessons`); the rest are all shown, in their given (live) order, when they fit. Otherwise the most relevant of
them that fit, still in their given order so that the prompt's lesson block stays a stable prefix. Relevant first by
evidence: what each lesson's trials measured it to add to success in this environment (`ScopedLesson.gains`, from
`scope.trial_gains`; text alone cannot tell which of a person's unscoped lessons helps where: bench/RESULTS.md,
"Continual learning" (c)), then by cosine similarity of the lesson to the episode's environment, goal and first
observation (the store's lesson index; a lesson without a stored id, or every lesson without a store, ranks after
the indexed ones in its given order). Greedy: down the ranking, each lesson is taken if the block still fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distill.lessons.curate import render_lessons
from distill.lessons.safety import prompt_lessons
from distill.lessons.scope import ScopedLesson

if TYPE_CHECKING:
    from memory import ExperienceStore


def count_words(text: str) -> int:
    """Whitespace words: the count a scripted policy (and a chat model without a tokenizer) uses."""
    return len(text.split())


@dataclass(frozen=True)
class LessonBudget:
    """How much of the lessons in scope one prompt holds (see the module docstring)."""

    budget_tokens: int | None = None  # None: no token limit
    max_lessons: int = 0  # 0: as many as fit the tokens
    count_tokens: Callable[[str], int] = count_words
    store: ExperienceStore | None = field(default=None, compare=False)  # the lesson index, for relevance

    @classmethod
    def from_settings(
        cls, settings: Any, count_tokens: Callable[[str], int], store: ExperienceStore | None = None
    ) -> LessonBudget:
        """The budget of a `LessonsConfig`: `budget_tokens` tokens and at most `context_lessons` lessons."""
        return cls(settings.budget_tokens, settings.context_lessons, count_tokens, store)

    @property
    def limits(self) -> tuple[int | None, int]:
        """What decides a selection besides the lessons and the episode (a key for results played under it)."""
        return self.budget_tokens, self.max_lessons

    def fits(self, texts: Sequence[str]) -> bool:
        if self.max_lessons and len(texts) > self.max_lessons:
            return False
        return self.budget_tokens is None or self.count_tokens(render_lessons(texts)) <= self.budget_tokens

    def select(self, lessons: Sequence[ScopedLesson], env_id: str, goal: str, observation: str) -> list[ScopedLesson]:
        """The lessons an episode of `env_id` with `goal` and first `observation` shows, in their given order."""
        lessons = [x for x in lessons if prompt_lessons([x.text])]
        if self.fits([x.text for x in lessons]):
            return lessons
        ranked = self._by_similarity(lessons, "\n".join(x for x in (env_id, goal, observation) if x))
        ranked.sort(key=lambda i: -dict(lessons[i].gains).get(env_id, 0.0))  # stable: similarity breaks ties
        chosen: set[int] = set()
        for i in ranked:
            if self.fits([x.text for j, x in enumerate(lessons) if j in chosen or j == i]):
                chosen.add(i)
        return [x for j, x in enumerate(lessons) if j in chosen]

    def _by_similarity(self, lessons: list[ScopedLesson], query: str) -> list[int]:
        """Positions of `lessons`, the most similar to `query` first (those the index does not hold last)."""
        ids = [x.id for x in lessons if x.id is not None]
        hits = self.store.search_lessons(query, k=len(ids), ids=ids) if self.store is not None and ids else []
        first = {h.item.id: rank for rank, h in enumerate(hits)}
        return sorted(range(len(lessons)), key=lambda i: first.get(lessons[i].id, len(first)))
