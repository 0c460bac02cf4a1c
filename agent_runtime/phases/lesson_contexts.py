"""The lessons an episode shows (`LessonContexts`): the live set as PLAY draws from it, one pool per episode, the
lessons in scope for the episode's environment, fitted to the budget for its goal and first observation.

The rules it applies are `distill.lessons`' (`scope.in_scope`, `budget.LessonBudget`, the screen of
`safety.prompt_lessons`); this module holds what needs the runtime: the draw an episode is played for, the context
the episode runner takes, and a live set that another process may change while the loop plays (`refresh`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from agent_runtime.episode.runner import Draw, EpisodeContext
from agent_runtime.state import Run
from distill.lessons import live_lessons, live_version
from distill.lessons.budget import LessonBudget, count_words
from distill.lessons.safety import prompt_lessons
from distill.lessons.scope import ScopedLesson, in_scope, scoped_lessons
from memory import ExperienceStore


class LessonContexts:
    """The live lessons an episode shows: one pool drawn per episode (seeded by the draw, so a resumed run draws the
    same), of it the lessons in scope for the draw's environment (`distill.lessons.scope`), and of those, when
    they hold more than `lessons.budget_tokens` (or `lessons.context_lessons`), the most relevant to the
    episode's goal and first observation (`choose`, after the environment's reset: `LessonBudget.select`, the
    selection every evaluation of the run makes too, `Run.evaluate`)."""

    REFRESH_SECONDS = 2.0  # how stale the lessons of a new draw may be after a person changed the live set

    def __init__(
        self,
        store: ExperienceStore,
        run_id: int,
        pools: int,
        seed: int,
        *,
        envs: Sequence[tuple[str, str]] = (),
        budget_tokens: int | None = None,
        max_lessons: int = 0,
        count_tokens: Callable[[str], int] | None = None,
    ):
        self.store, self.run_id, self.pools, self.seed = store, run_id, pools, seed
        self.envs = list(envs)  # (env id, family) per env index of the draws; none: every lesson everywhere
        self.budget = LessonBudget(budget_tokens, max_lessons, count_tokens or count_words, store)
        self.reload()

    @classmethod
    def for_run(cls, run: Run, envs: Sequence[tuple[str, str]] = ()) -> LessonContexts:
        settings, budget = run.config.lessons, run.lesson_budget
        return cls(
            run.store,
            run.id,
            settings.pools,
            settings.pool_seed,
            envs=envs,
            budget_tokens=budget.budget_tokens,
            max_lessons=budget.max_lessons,
            count_tokens=budget.count_tokens,
        )

    def reload(self) -> None:
        version, lessons = live_lessons(self.store, self.run_id)
        self.version = version.version if version is not None else None
        # a stored lesson the screen now rejects never reaches the prompt (`render_lessons`), so an
        # episode does not list it among the lessons it had in context either
        lessons = [x for x in lessons if prompt_lessons([x.text])]
        self.by_pool = {p: [x for x in lessons if x.pool == p] for p in range(self.pools)}
        self.scoped = {x.id: x for x in scoped_lessons(lessons)}
        self._checked = time.monotonic()

    def refresh(self) -> None:
        """Reload when another process changed the live set (`lessons add|retire|forget` while the loop
        plays), looking at most every REFRESH_SECONDS: a forgotten lesson leaves the next draws' prompts."""
        if time.monotonic() - self._checked < self.REFRESH_SECONDS:
            return
        self._checked = time.monotonic()
        live = live_version(self.store, self.run_id)
        if (live.version if live is not None else None) != self.version:
            self.reload()

    def for_draw(self, draw: Draw) -> EpisodeContext:
        """The drawn pool's lessons in scope for the draw's environment (all of them: `choose` fits the budget)."""
        self.refresh()
        pool = random.Random(f"pool:{self.seed}:{draw.index}").randrange(self.pools) if self.pools > 1 else 0
        lessons = self.by_pool.get(pool, [])
        if self.envs:
            env_id, family = self.envs[draw.env_index]
            lessons = [x for x in lessons if in_scope(x.scope, env_id, family)]
        return EpisodeContext(tuple(x.text for x in lessons), tuple(x.id for x in lessons), self.version)

    def choose(self, context: EpisodeContext, env_id: str, goal: str, observation: str) -> EpisodeContext:
        """`context` fitted to the budget for the episode's environment, goal and first observation
        (`LessonBudget.select`: all its lessons when they fit, else the most relevant that do, in live order)."""
        lessons = [self.scoped.get(i, ScopedLesson(text, id=i)) for text, i in zip(context.lessons, context.lesson_ids)]
        chosen = self.budget.select(lessons, env_id, goal, observation)
        return EpisodeContext(tuple(x.text for x in chosen), tuple(x.id for x in chosen), context.version)

    def texts(self, pool: int = 0) -> list[str]:
        return [x.text for x in self.by_pool.get(pool, [])]
