"""Evaluation reuses what it built: specs and task lists, and started environment instances (`EnvPool`), with the
same outcome as a fresh build: identical episodes on real TextWorld games with a seeded random policy, broken
instances closed and never lent again, nothing given back after a run that raised, specs keyed by what decides
them, a forked child never touching its parent's instances."""

from __future__ import annotations

import os
from typing import ClassVar

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.evaluation import EnvPool, close_env_pool, env_pool, evaluate, evaluator
from agent_runtime.llm.scripted import ScriptedBackend
from environments.base import EnvSpec, TextEnv

COUNTING = "tests.agent_runtime.evaluation.test_evaluate_reuse:CountingEnv"


class CountingEnv(TextEnv):
    """Task eval-i is won when i is even; eval-3's step raises (a broken instance). Counts what is made and closed."""

    spec = EnvSpec(id="tests/counting", max_steps=2, family="text")
    made: ClassVar[list[CountingEnv]] = []

    def __init__(self, cache_dir=None, tag: str = "a"):
        self.tag, self.closed, self.task = tag, False, None
        CountingEnv.made.append(self)

    def tasks(self, split):
        return [f"{split}-{i}" for i in range(6)]

    def reset(self, *, seed=None, task_id=None):
        assert not self.closed, "a closed instance was lent"
        self.task = task_id
        return f"Room {self.tag}.", {"admissible_actions": ["go"]}

    def step(self, action):
        index = int(self.task.split("-")[1])
        if index == 3:
            raise RuntimeError("the game process died")
        won = index % 2 == 0
        return "done", float(won), True, False, {"won": won}

    def close(self):
        self.closed = True


@pytest.fixture(autouse=True)
def _fresh_counts():
    CountingEnv.made = []
    yield
    close_env_pool()


def played() -> list[CountingEnv]:
    """The instances that played (build_envs also makes one probe per spec, closed at once)."""
    return [e for e in CountingEnv.made if e.task is not None]


def counting_config(tag="a", slots=2):
    return config_from_dict(
        {
            "name": "c",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [{"id": COUNTING, "kwargs": {"tag": tag}}],
            "runtime": {"slots": slots},
            "evaluation": {"episodes_per_env": 6},
        }
    )


def outcomes(results):
    return [
        (r.env_id, [(e["task_id"], e["seed"], e["won"], e["outcome"], e["steps"], e["return"]) for e in r.episodes])
        for r in results
    ]


@pytest.mark.slow
def test_textworld_outcomes_are_the_same_with_and_without_reuse(tmp_path, games_dir):
    """Real games, several slots, a seeded random policy: a cold pooled call, warm ones (after calls that left the
    instances on other games) and a fresh build play identical episodes."""
    config = config_from_dict(
        {
            "name": "t",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [
                {
                    "id": "textworld/coin_collector",
                    "max_steps": 4,
                    "kwargs": {"level": 1, "n_eval": 6, "cache_dir": str(games_dir)},
                }
            ],
            "runtime": {"slots": 3},
            "evaluation": {"episodes_per_env": 6},
        }
    )

    def run(**kwargs):
        return outcomes(evaluate(config, tmp_path, ScriptedBackend(seed=7), **kwargs))

    fresh = run(reuse=False)
    pool = EnvPool()
    cold = run(pool=pool)
    assert pool.started == 3 and pool.reused == 0 and pool.idle() == 3
    evaluate(config, tmp_path, ScriptedBackend(seed=99), pool=pool, episodes_per_env=4, slots=2)
    warm = run(pool=pool)
    warm_again = run(pool=pool)
    assert pool.started == 3 and pool.reused == 2 + 3 + 3  # no instance started after the first call
    assert cold == fresh and warm == fresh and warm_again == fresh
    [(_, episodes)] = fresh
    assert len(episodes) == 6 and {won for _, _, won, *_ in episodes} == {True, False}  # a telling comparison
    pool.close()
    assert pool.idle() == 0


def test_instances_are_lent_again_and_broken_ones_closed(tmp_path):
    pool = EnvPool()
    first = evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool)
    # two slots; eval-3's instance broke and was closed, its slot got a new one
    assert len(played()) == 3 and [e.closed for e in played()].count(True) == 1
    assert pool.idle() == 2
    second = evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool)
    assert outcomes(second) == outcomes(first)
    assert [e["outcome"] for e in first[0].episodes] == ["won", "lost", "won", "error", "won", "lost"]
    assert len(played()) == 4  # only the replacement of the instance eval-3 broke again
    broken = [e for e in played() if e.closed]
    assert len(broken) == 2 and all(e.task == "eval-3" for e in broken)
    assert pool.idle() == 2
    pool.close()
    assert pool.idle() == 0 and all(e.closed for e in CountingEnv.made)
    evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool)  # usable again, from fresh instances
    assert len(played()) == 7


class FailingBackend(ScriptedBackend):
    """Acts for `turns` batched calls, then raises (a backend that fails mid-run)."""

    def __init__(self, turns):
        super().__init__()
        self.turns = turns

    def choose(self, prompts, choices, params):
        self.turns -= 1
        if self.turns < 0:
            raise RuntimeError("the model server went away")
        return super().choose(prompts, choices, params)


def test_nothing_is_given_back_after_a_run_that_raised(tmp_path):
    pool = EnvPool()
    evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool)
    assert pool.idle() == 2
    with pytest.raises(RuntimeError, match="went away"):
        evaluate(counting_config(), tmp_path, FailingBackend(turns=1), pool=pool)
    assert pool.idle() == 0 and all(e.closed for e in CountingEnv.made)


def test_specs_and_instances_are_keyed_by_what_decides_them(tmp_path, monkeypatch):
    builds = []
    real = evaluator.build_envs
    monkeypatch.setattr(evaluator, "build_envs", lambda *a, **k: builds.append(k["split"]) or real(*a, **k))
    pool = EnvPool()
    evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool)
    evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool, lessons=["Go first."], episodes_per_env=2)
    assert builds == ["eval"]
    evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool, split="train")
    assert builds == ["eval", "train"] and len(played()) == 6  # new instances: never lent across splits
    evaluate(counting_config(tag="b"), tmp_path, ScriptedBackend(), pool=pool)
    assert builds == ["eval", "train", "eval"]
    tagged = [e for e in played() if e.tag == "b"]
    assert len(tagged) == 3 and len(played()) == 9  # new instances: never one of tag "a"
    evaluate(counting_config(), tmp_path / "other", ScriptedBackend(), pool=pool)
    assert builds == ["eval", "train", "eval", "eval"]
    with_max_steps = counting_config()
    with_max_steps.envs[0].max_steps = 1
    made = len(played())
    evaluate(with_max_steps, tmp_path, ScriptedBackend(), pool=pool)
    assert len(builds) == 5 and len(played()) == made + 1  # a new spec, the same instances (+ eval-3's)


def test_a_forked_child_never_uses_or_closes_its_parents_instances(tmp_path, monkeypatch):
    pool = EnvPool()
    evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool)
    parents = played()
    monkeypatch.setattr(os, "getpid", lambda: -12345)  # as a fork's child sees it
    evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool)
    pool.close()
    assert not any(e.closed for e in parents if e.task != "eval-3")
    children = [e for e in played() if e not in parents]
    assert len(children) == 3 and all(e.closed for e in children)


def test_the_default_pool_and_reuse_off(tmp_path):
    evaluate(counting_config(), tmp_path, ScriptedBackend())
    assert env_pool().idle() == 2
    evaluate(counting_config(), tmp_path, ScriptedBackend(), reuse=False)
    assert len(CountingEnv.made) == 4 + 4  # a probe and three played each time: nothing borrowed the second
    assert all(e.closed for e in CountingEnv.made[4:]) and env_pool().idle() == 2
    close_env_pool()
    assert env_pool().idle() == 0 and all(e.closed for e in CountingEnv.made)


def test_a_small_pool_closes_the_oldest_idle_instances(tmp_path):
    pool = EnvPool(max_idle=3)
    evaluate(counting_config(), tmp_path, ScriptedBackend(), pool=pool)
    evaluate(counting_config(tag="b"), tmp_path, ScriptedBackend(), pool=pool)
    assert pool.idle() == 3
    idle_a = [e for e in played() if e.tag == "a" and not e.closed]
    assert len(idle_a) == 1  # one of tag "a" closed to make room for tag "b"'s two


def test_a_run_plays_its_evaluations_from_its_own_pool(tmp_path):
    """`Run.evaluate`: the phases' evaluations build and lend from the run's pool (the process's unless it is given
    one), with the same outcomes as a plain evaluation; `envs=` plays other environments from the same pool."""
    from agent_runtime.state import Run
    from memory import ExperienceStore

    config = counting_config(slots=1)
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run(config.name, config.model_dump(mode="json"))
        assert Run(config, tmp_path, store, run_id).pool is env_pool(), "by default the process's pool"
        own, before = Run(config, tmp_path, store, run_id, pool=EnvPool()), env_pool().started
        results = own.evaluate(ScriptedBackend(seed=0), lessons=[], episodes_per_env=3)
        assert own.pool.started == 1 and env_pool().started == before, "built into the run's pool, not the process's"
        again = own.evaluate(ScriptedBackend(seed=0), lessons=[], episodes_per_env=3)
        assert own.pool.reused >= 1 and outcomes(again) == outcomes(results)
        fresh = evaluate(config, tmp_path, ScriptedBackend(seed=0), lessons=[], episodes_per_env=3, reuse=False)
        assert outcomes(fresh) == outcomes(results)
        other = own.evaluate(
            ScriptedBackend(seed=0), envs=[{"id": COUNTING, "kwargs": {"tag": "b"}}], episodes_per_env=1
        )
        assert [r.env_id for r in other] == [r.env_id for r in results] and own.pool.started == 2
        own.pool.close()
