"""Retrieved examples: past successful episodes shown to the agent as few-shot demonstrations (optional).

With `agent.retrieved_examples: K`, an episode's first observation is used as a query into the experience memory's
episode index (same environment, won episodes only), and the K nearest past episodes are shown in the system prompt as
compact demonstrations: the goal and the actions that won. The task being played and held-out evaluation tasks are never
shown (`agent_runtime.evaluation.heldout`): the task being played is known by its task id and by its opening (the same
game can stand under two ids), unless the environment shows that opening for several tasks (then the opening says
nothing about which game it is, and excluding it would leave no example at all). Off by default: the lessons are the
method's channel for experience, and examples cost context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agent_runtime.episode.openings import observation_hash
from memory import EpisodeInfo, ExperienceStore


class Guard(Protocol):
    """What the retriever asks of the held-out set (`evaluation.heldout.HeldOut` is one)."""

    def identifies(self, env_id: str, opening_hash: str) -> bool: ...

    def usable(self, episode: EpisodeInfo) -> bool: ...


MAX_EXAMPLE_CHARS = 400
OVERFETCH = 4  # hits asked for per example wanted: the task being played and held-out tasks are dropped


def render_example(episode) -> str:
    actions = " > ".join(s.action for s in episode.steps if s.action)
    goal = (episode.goal or "").strip().replace("\n", " ")
    text = f"Goal: {goal} | Winning actions: {actions}" if goal else f"Winning actions: {actions}"
    return text[:MAX_EXAMPLE_CHARS]


def example_retriever(store: ExperienceStore, run_id: int, k: int, held: Callable[[], Guard] | None = None):
    """A callable (env_id, task_id, first observation) -> example texts, for the episode runner. It never
    returns the task being played (by task id, or by opening where the opening identifies a game), nor a held-out
    evaluation task (`held`, built on first use)."""
    guard: list[Guard] = []

    def retrieve(env_id: str, task_id: str, observation: str) -> list[str]:
        if held is not None and not guard:
            guard.append(held())
        opening = observation_hash(observation)
        by_opening = not guard or guard[0].identifies(env_id, opening)
        hits = store.search_episodes(observation, k * OVERFETCH, run_id=run_id, env_id=env_id, won=True)
        out = []
        for hit in hits:
            episode = store.episode(hit.id)
            same_game = episode.task_id == task_id or (
                by_opening and bool(episode.steps) and observation_hash(episode.steps[0].observation) == opening
            )
            if same_game or (guard and not guard[0].usable(episode)):
                continue
            out.append(render_example(episode))
            if len(out) == k:
                break
        return out

    return retrieve
