"""A curriculum's phases hold only their own games: a runner that lives across phases (a Ray rollout worker's) closes
its slots' instances of the environments the coming phase does not play, and the evaluation pool keeps only the coming
phase's instances when a phase's PLAY starts (a game on the JVM holds ~500 MB)."""

from __future__ import annotations

from typing import ClassVar

from agent_runtime.config import config_from_dict
from agent_runtime.episode.build import build_envs, build_prompt_builders
from agent_runtime.episode.runner import Draw, EpisodeRunner
from agent_runtime.evaluation import EnvPool, evaluate
from agent_runtime.llm.base import SamplingParams
from agent_runtime.llm.scripted import ScriptedBackend
from agent_runtime.run.play import phase_plays
from environments.testing import GuessEnv

HERE = "tests.agent_runtime.episode.test_episode_phase_games"


class HeldGame(GuessEnv):
    """A GuessEnv that keeps a list of the instances open, as a JVM game's would hold its memory."""

    open: ClassVar[list[HeldGame]] = []

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        HeldGame.open.append(self)

    def close(self) -> None:
        if self in HeldGame.open:
            HeldGame.open.remove(self)
        super().close()


class FirstGame(HeldGame):
    pass


class SecondGame(HeldGame):
    pass


def curriculum_config():
    return config_from_dict(
        {
            "name": "phases",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [{"id": f"{HERE}:FirstGame"}, {"id": f"{HERE}:SecondGame"}],
            "runtime": {"slots": 3},
            "evaluation": {"episodes_per_env": 3},
            "curriculum": {
                "phases": [
                    {"envs": [f"{HERE}:FirstGame"], "episodes": 6},
                    {"envs": [f"{HERE}:SecondGame"], "episodes": 6},
                ]
            },
        }
    )


def test_a_runner_across_phases_closes_the_games_the_coming_phase_does_not_play(tmp_path):
    config = curriculum_config()
    specs, tasks = build_envs(config, tmp_path)
    HeldGame.open = []
    backend = ScriptedBackend()
    runner = EpisodeRunner(
        backend,
        specs,
        build_prompt_builders(config, specs, backend),
        SamplingParams(max_new_tokens=4),
        slots=3,
        plays=phase_plays(config),
    )
    first = [Draw(i, 0, tasks[0][i], i) for i in range(6)]
    runner.run(lambda: first.pop(0) if first else None, lambda record: None)
    assert {type(g) for g in HeldGame.open} == {FirstGame} and len(HeldGame.open) == 3  # one a slot, between episodes
    seen = []
    second = [Draw(i, 1, tasks[1][i - 6], i) for i in range(6, 12)]

    def on_episode(record):
        seen.append(sorted(type(g).__name__ for g in HeldGame.open))

    runner.run(lambda: second.pop(0) if second else None, on_episode)
    assert seen and all(held == ["SecondGame"] * 3 for held in seen)  # phase 1's three games went before phase 2's
    runner.close()
    assert HeldGame.open == []


def test_without_a_curriculum_a_runner_keeps_every_game():
    assert phase_plays(config_from_dict({"name": "x", "envs": [{"id": f"{HERE}:FirstGame"}]})) is None


def test_the_pool_keeps_only_the_games_of_the_coming_phase(tmp_path):
    config = curriculum_config()
    pool = EnvPool()
    HeldGame.open = []
    evaluate(config, tmp_path, ScriptedBackend(), pool=pool)  # an assessment: every environment of the run
    evaluate(config, tmp_path, ScriptedBackend(), pool=pool, split="train", episodes_per_env=1)
    assert {type(g) for g in HeldGame.open} == {FirstGame, SecondGame}
    held = pool.idle()
    closed = pool.keep_only([f"{HERE}:SecondGame"])
    assert closed > 0 and pool.idle() == held - closed
    assert {type(g) for g in HeldGame.open} == {SecondGame}  # of both splits
    again = pool.reused
    evaluate(config, tmp_path, ScriptedBackend(), pool=pool)
    assert pool.reused > again  # the second game's instances are still lent
    pool.close()
    assert HeldGame.open == []
