"""`Cycle`: one OPCD cycle as it runs (`agent_runtime.phases.consolidate.run_cycle`): what it distils, from which
policy, under which cycle row, and which lessons teach which prompt: those its episode's prompt held in PLAY (the
lessons in scope for its environment, fitted to the budget for its goal and first observation: `LessonBudget`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_runtime.phases.system_prompt import SystemPrompt
from agent_runtime.phases.turn_prompts import Decision
from distill.lessons.budget import LessonBudget
from distill.lessons.curate import render_lessons
from distill.lessons.scope import ScopedLesson, in_scope_lessons, scoped_lessons
from distill.opcd import TeacherSpec
from memory import AdapterInfo, LessonInfo, LessonSetInfo


def lesson_pools(lessons: list[LessonInfo]) -> list[int]:
    """The lesson pools of a set, in order (each pool is one context block)."""
    return sorted({x.pool for x in lessons})


@dataclass
class Cycle:
    """One cycle as it runs: what it distils, from which policy, under which cycle row (set at its start), then its
    adapter, KL measurements and metrics as it trains and is evaluated (the row's curves go to the store step by
    step)."""

    cycle_id: int
    kind: str  # "lessons", or "system_prompt" (`opcd.context`)
    parent: AdapterInfo | None  # the run's adapter at the start: the student's parent and the acting policy
    live: LessonSetInfo | None  # the live lesson set it is taught (None: a system prompt)
    lessons: list[LessonInfo]  # that set's lessons (none for a system prompt)
    system: SystemPrompt | None
    contexts: list[str]  # the context blocks: one per lesson pool, or the system prompt
    teacher_spec: TeacherSpec | None  # a separate teacher (None: the parent teaches)
    teacher: dict[str, Any]  # the teacher's record for the cycle row
    prompt_file: list[list[dict]] | None = None  # the chats of `opcd.context.prompts` (None: the run's own)
    adapter_id: int | None = None  # the adapter it trained, once written
    kl: tuple[float, float] | None = None  # held-out KL to the teacher, before and after training
    lesson_kl: tuple[dict, dict] | None = None  # per lesson id, before and after
    metrics: dict[str, Any] = field(default_factory=dict)  # the cycle row's metrics as they are filled in
    families: dict[str, str] = field(default_factory=dict)  # each environment's prompt family (lesson scopes)
    budget: LessonBudget | None = None  # what one prompt holds of the lessons in scope (None: all of them)
    _chosen: dict[tuple, list[str]] = field(default_factory=dict, init=False, repr=False)  # contexts_for's, by episode

    def shown(self) -> dict[str, Any]:
        """What the "with lessons" conditions of EVALUATE show: the first pool's lessons (each environment those in
        its scope), or the system prompt."""
        if self.system:
            return {"lessons": [], "context": self.system.text}
        first = lesson_pools(self.lessons)[0]
        return {"lessons": scoped_lessons(x for x in self.lessons if x.pool == first)}

    def contexts_for(self, decision: Decision) -> list[str]:
        """The teacher's context blocks for one prompt: per pool, what PLAY's prompt of its episode would hold of the
        pool (the lessons in scope for its environment, fitted to `budget` for the episode's goal and first
        observation); every lesson of the pool for a prompt of no environment; the system prompt for a
        system-prompt cycle."""
        if self.system or decision.env_id is None:
            return self.contexts
        key = (decision.env_id, decision.goal, decision.opening)
        if key not in self._chosen:
            self._chosen[key] = [self._pool_context(pool, decision) for pool in lesson_pools(self.lessons)]
        return list(self._chosen[key])

    def _pool_context(self, pool: int, decision: Decision) -> str:
        env_id = decision.env_id
        shown: list[ScopedLesson] = in_scope_lessons(
            scoped_lessons(x for x in self.lessons if x.pool == pool), env_id, self.families.get(env_id)
        )
        if self.budget is not None:
            shown = self.budget.select(shown, env_id, decision.goal, decision.opening)
        return render_lessons([x.text for x in shown])

    def taught(self, decisions: list[Decision]) -> tuple[list[Decision], list[Decision]]:
        """(the decisions some lesson is in scope for, those of environments no lesson is): the first are taught
        with their environment's lessons, the second replayed (the student held to its parent there)."""
        if self.system:
            return decisions, []
        replay = [d for d in decisions if not any(self.contexts_for(d))]
        return [d for d in decisions if any(self.contexts_for(d))], replay
