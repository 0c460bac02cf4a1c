"""Turn prompts: the decisions a cycle learns from and the adapter probe measures on, each turn of a logged episode
rebuilt as the prompt the agent decided from, without lessons (OEL's recipe for multi-turn agents), with its action
set in choice mode (`Decision`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agent_runtime.episode.build import build_envs, build_prompt_builders
from agent_runtime.episode.prompt import Turn
from agent_runtime.state import Run


@dataclass(frozen=True)
class Decision:
    """One per-turn prompt of a logged episode, as the agent saw it but without lessons."""

    chat: list[dict]
    episode_ids: list[int]
    choices: list[str] | None = None  # the action set of a choice-mode step
    env_id: str | None = None  # the environment it was played in (None: a prompt file's)
    goal: str = ""  # its episode's goal and first observation: what chose the lessons that episode showed
    opening: str = ""


def episode_prefixes(run: Run, backend, limit: int, env_id: str | None = None) -> list[Decision]:
    """Every turn of the run's `limit` newest episodes (of `env_id`, if given), rebuilt without lessons (held-out
    evaluation tasks are left out: `agent_runtime.evaluation.heldout`)."""
    config, store = run.config, run.store
    specs, _ = build_envs(config, run.workdir)
    builders = {s.env_id: b for s, b in zip(specs, build_prompt_builders(config, specs, backend))}
    held = run.held
    out = []
    for info in store.episodes(run.id, env_id=env_id, limit=limit):
        builder = builders.get(info.env_id)
        if builder is None or info.outcome == "error":
            continue
        episode = store.episode(info.id)
        if not held.usable(episode):
            continue
        out.extend(turn_prefixes(builder, episode.steps, info.id, env_id=info.env_id, goal=episode.goal or ""))
    return out


def turn_prefixes(
    builder, steps, episode_id: int | None = None, *, env_id: str | None = None, goal: str = ""
) -> list[Decision]:
    """Each turn of one episode's `steps` as the prompt it was decided from, rebuilt without lessons."""
    out, history = [], []
    opening = steps[0].observation if steps else ""
    for step in steps:
        chat = builder.build(history, step.observation, step.admissible_actions, lessons=[])
        choices = step.admissible_actions if (step.info or {}).get("action_mode") == "choice" else None
        ids = [] if episode_id is None else [episode_id]
        out.append(Decision(chat, ids, list(choices) if choices else None, env_id, goal, opening))
        history.append(Turn(step.observation, step.response, step.admissible_actions))
    return out


def active_envs(run: Run) -> list[str]:
    """The environments the run is playing now: those among its `opcd.recent_episodes` newest episodes."""
    newest = run.store.episodes(run.id, limit=run.config.opcd.recent_episodes)
    return list(dict.fromkeys(e.env_id for e in newest))


def recent_decisions(run: Run, backend) -> list[Decision]:
    """The turns a cycle learns from: the `opcd.recent_episodes` newest episodes of each environment the run is
    playing now (`active_envs`), so an environment played beside others gets the share of the cycle it would get
    alone (why: bench/RESULTS.md, "Continual learning", (a))."""
    n = run.config.opcd.recent_episodes
    return [d for env in active_envs(run) for d in episode_prefixes(run, backend, n, env)]


def choose_prompts(decisions: list[Decision], cycle_id: int, limit: int) -> list[Decision]:
    """At most `limit` decisions in the cycle's own seeded order. The agent acts by choosing wherever it can:
    then the choice policy is what is distilled, on the choice-mode steps (free-mode steps of the same run,
    e.g. math beside games, wait for a free-mode cycle)."""
    if any(d.choices for d in decisions):
        decisions = [d for d in decisions if d.choices]
    decisions = list(decisions)
    random.Random(f"cycle:{cycle_id}").shuffle(decisions)
    return decisions[:limit]


def rehearsal(run: Run, backend, cycle_id: int, *, skip: bool = False) -> list[Decision]:
    """The newest `opcd.replay_episodes` episodes of each environment the run has played that the recent episodes
    leave out (a curriculum's earlier phases), rebuilt as prompts: the cycle rehearses every environment it knows
    (`skip`: a cycle that distils a system prompt or a prompt file)."""
    per_env = run.config.opcd.replay_episodes
    if skip or not per_env:
        return []
    recent = set(active_envs(run))
    out = []
    for env in run.played_envs():
        if env not in recent:
            out += choose_prompts(episode_prefixes(run, backend, per_env, env), cycle_id, run.config.opcd.max_prompts)
    return out
