"""Building a run's environments and prompt builders from its config.

Each entry of `config.envs` becomes an `EnvSlotSpec` (a factory the runner calls once per slot, the
environment's family and its step budget) plus the task ids of a split. One probe instance is made per
entry up front, so an unknown environment id or a bad keyword fails before any model is loaded or any
episode runs. Generated games go to the cache shared by every workdir (`environments.game_cache.run_games_dir`:
`$AGENT_RUNTIME_CACHE/games`, else `~/.cache/agent-runtime/games`; an old workdir's own `games/` folder is kept)
unless the entry sets `cache_dir`.
"""

from __future__ import annotations

from pathlib import Path

import environments
from agent_runtime.config import RunConfig
from agent_runtime.episode.prompt import PromptBuilder
from agent_runtime.episode.runner import EnvSlotSpec
from agent_runtime.llm.base import PolicyBackend, SamplingParams
from agent_runtime.llm.modes import resolve_action_mode
from environments.game_cache import run_games_dir
from environments.registry import check_env_id


def build_envs(config: RunConfig, workdir: Path, split: str = "train") -> tuple[list[EnvSlotSpec], list[list[str]]]:
    specs, tasks = [], []
    for entry in config.envs:
        check_env_id(entry.id)  # a config's `module:Name` is imported only when allowed (or --trust-code)

        def factory(entry=entry):
            kwargs = {"cache_dir": str(run_games_dir(workdir)), **entry.kwargs}
            return environments.make(entry.id, **kwargs)

        probe = factory()
        try:
            specs.append(EnvSlotSpec(entry.id, factory, probe.spec.family, entry.max_steps or probe.spec.max_steps))
            tasks.append(list(probe.tasks(split)))
        finally:
            probe.close()
    return specs, tasks


def sampling_params(model) -> SamplingParams:
    """How the acting policy samples, from the run's `ModelConfig`."""
    return SamplingParams(max_new_tokens=model.max_new_tokens, temperature=model.temperature, top_p=model.top_p)


def build_prompt_builders(
    config: RunConfig,
    specs: list[EnvSlotSpec],
    backend: PolicyBackend,
    context: str | None = None,
) -> list[PromptBuilder]:
    """One prompt builder per environment, without lessons of its own: an episode's lessons are chosen once its game
    is reset (`EpisodeRunner`'s `context_for` and `choose_lessons`), in PLAY as in every evaluation."""
    agent = config.agent
    return [
        PromptBuilder(
            family=spec.family,
            count_tokens=backend.count_tokens,
            context_window=backend.context_window,
            system_prompt=agent.system_prompt,
            show_admissible_actions=agent.show_admissible_actions,
            history_shows_admissible=agent.history_shows_admissible,
            max_history_turns=agent.max_history_turns,
            reserve_tokens=config.model.max_new_tokens,
            action_mode=resolve_action_mode(agent.action_mode, spec.family),
            context=context,
        )
        for spec in specs
    ]
