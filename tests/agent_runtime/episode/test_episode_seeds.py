"""The runner seeds every draw of a turn by (run seed, draw index, turn): a draw plays the same whichever slots play
beside it and whatever was played before, in choice mode and in free text; a backend that cannot seed a row by
itself (a remote chat model) plays episodes that say they may not replay."""

from __future__ import annotations

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.episode.build import build_envs, build_prompt_builders
from agent_runtime.episode.runner import EpisodeRunner, TaskSampler
from agent_runtime.llm.base import SamplingParams
from agent_runtime.llm.scripted import ScriptedBackend


def play(backend, workdir, *, slots: int, action_mode: str, draws: int = 8, explore: float = 0.0):
    """Every draw's episode, played with `slots` slots: its responses and actions, by draw."""
    config = config_from_dict(
        {
            "name": "seeds",
            "seed": 5,
            "envs": [{"id": "environments.testing:GuessEnv"}],
            "model": {"name": "scripted", "backend": "scripted"},
            "agent": {"action_mode": action_mode},
        }
    )
    specs, tasks = build_envs(config, workdir)
    sampler = TaskSampler([1.0], tasks, config.seed)
    queue = [sampler.draw(i) for i in range(draws)]
    records = []
    runner = EpisodeRunner(
        backend,
        specs,
        build_prompt_builders(config, specs, backend),
        SamplingParams(max_new_tokens=4, temperature=1.0),
        slots=slots,
        explore=explore,
        seed=config.seed,
    )
    runner.run(lambda: queue.pop(0) if queue else None, records.append)
    runner.close()
    return {r.metadata["draw"]: [(s.response, s.action) for s in r.steps] for r in records}, records


@pytest.mark.parametrize("action_mode", ["choice", "free"])
def test_a_scripted_draw_plays_the_same_whatever_the_slots_beside_it(tmp_path, action_mode):
    alone, _ = play(ScriptedBackend(), tmp_path, slots=1, action_mode=action_mode, explore=0.3)
    beside, _ = play(ScriptedBackend(), tmp_path, slots=4, action_mode=action_mode, explore=0.3)
    assert alone == beside
    assert len({a for steps in alone.values() for _, a in steps}) > 2, "the policy sampled among the guesses"


@pytest.mark.slow
@pytest.mark.parametrize("action_mode", ["choice", "free"])
def test_a_transformers_draw_plays_the_same_whatever_the_slots_beside_it(tmp_path, tiny_backend, action_mode):
    alone, _ = play(tiny_backend, tmp_path, slots=1, action_mode=action_mode, draws=6)
    beside, _ = play(tiny_backend, tmp_path, slots=3, action_mode=action_mode, draws=6)
    assert alone == beside
    assert len({r for steps in alone.values() for r, _ in steps}) > 1, "the policy sampled"


def test_episodes_of_a_backend_that_cannot_seed_rows_say_they_may_not_replay(tmp_path):
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from agent_runtime.llm.chat_backend import ChatBackend

    _, remote = play(ChatBackend(FakeListChatModel(responses=["3"])), tmp_path, slots=2, action_mode="choice", draws=2)
    _, scripted = play(ScriptedBackend(), tmp_path, slots=2, action_mode="choice", draws=2)
    assert [r.metadata.get("replays") for r in remote] == [False, False]
    assert all("replays" not in r.metadata for r in scripted)
