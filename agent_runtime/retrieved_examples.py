"""Retrieved examples: past successful episodes shown to the agent as few-shot demonstrations (optional).

With `agent.retrieved_examples: K`, an episode's first observation is used as a query into the experience
memory's episode index (same environment, won episodes only), and the K nearest past episodes are shown in the
system prompt as compact demonstrations: the goal and the actions that won. Off by default: the lessons are the
method's channel for experience, and examples cost context.
"""

from __future__ import annotations

from memory import ExperienceStore

MAX_EXAMPLE_CHARS = 400


def render_example(episode) -> str:
    actions = " > ".join(s.action for s in episode.steps if s.action)
    goal = (episode.goal or "").strip().replace("\n", " ")
    text = f"Goal: {goal} | Winning actions: {actions}" if goal else f"Winning actions: {actions}"
    return text[:MAX_EXAMPLE_CHARS]


def example_retriever(store: ExperienceStore, run_id: int, k: int):
    """A callable (env_id, first observation) -> example texts, for the episode runner."""

    def retrieve(env_id: str, observation: str) -> list[str]:
        hits = store.search_episodes(observation, k, run_id=run_id, env_id=env_id, won=True)
        return [render_example(store.episode(h.id)) for h in hits]

    return retrieve
