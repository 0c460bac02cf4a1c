"""`Run.evaluate` plays a result it already has only once: the same weights on the same games with the same prompt
are reused, and anything that could change an episode (other weights, another backend, lessons in scope, tasks,
split, context, sampling, a caller that reads turns) plays the games."""

from __future__ import annotations

from typing import ClassVar

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.evaluation import EnvPool
from agent_runtime.llm.scripted import ScriptedBackend
from agent_runtime.state import Run
from distill.lessons.scope import ScopedLesson
from environments.base import EnvSpec, TextEnv
from memory import ExperienceStore

HERE = "tests.agent_runtime.state.test_run_played"


class ResetCountingEnv(TextEnv):
    """Task i is won when i is even (tag "a") or odd (any other tag); every reset (one per episode played) is counted
    per tag."""

    spec = EnvSpec(id="tests/reset-counting", max_steps=2, family="text")
    resets: ClassVar[dict[str, int]] = {}

    def __init__(self, cache_dir=None, tag: str = "a"):
        self.tag, self.task = tag, None

    def tasks(self, split):
        return [f"{split}-{i}" for i in range(6)]

    def reset(self, *, seed=None, task_id=None):
        ResetCountingEnv.resets[self.tag] = ResetCountingEnv.resets.get(self.tag, 0) + 1
        self.task = task_id
        return f"Room {self.tag}.", {"admissible_actions": ["go"]}

    def step(self, action):
        won = int(self.task.split("-")[1]) % 2 == (0 if self.tag == "a" else 1)
        return "done", float(won), True, False, {"won": won}

    def close(self):
        pass


class WeightsBackend(ScriptedBackend):
    """A scripted policy that says which weights it acts with, as the transformers and vLLM backends do."""

    def __init__(self):
        super().__init__(seed=0)
        self.adapters: dict[str, str] = {}
        self.active_adapter: str | None = None
        self.fingerprints: dict[str, str | None] = {}

    def load_adapter(self, name, path):
        self.adapters[name] = str(path)

    def use_adapter(self, name):
        self.active_adapter = name

    def adapter_fingerprint(self):
        return self.fingerprints.get(self.active_adapter) if self.active_adapter else None


def config(**evaluation):
    return config_from_dict(
        {
            "name": "played",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [{"id": f"{HERE}:ResetCountingEnv", "kwargs": {"tag": "a"}}],
            "runtime": {"slots": 2},
            "evaluation": {"episodes_per_env": 4, **evaluation},
        }
    )


@pytest.fixture
def run(tmp_path):
    ResetCountingEnv.resets = {}
    cfg = config()
    with ExperienceStore.open(tmp_path) as store:
        pool = EnvPool()
        yield Run(cfg, tmp_path, store, store.create_run(cfg.name, cfg.model_dump(mode="json")), pool=pool)
        pool.close()


def played(tag="a") -> int:
    return ResetCountingEnv.resets.get(tag, 0)


def outcomes(results):
    return [(r.env_id, [(e["task_id"], e["seed"], e["won"]) for e in r.episodes]) for r in results]


def test_the_same_evaluation_is_played_once_and_its_copies_are_the_callers(run):
    backend = WeightsBackend()
    first = run.evaluate(backend, lessons=[], episodes_per_env=4, split="train")
    assert played() == 4 and [e["won"] for e in first[0].episodes] == [True, False, True, False]
    first[0].episodes[0]["won"] = "changed by a caller"
    first[0].episodes.append({"won": True})
    again = run.evaluate(backend, lessons=None, episodes_per_env=4, split="train")  # None and [] show the same
    assert played() == 4, "nothing played again"
    assert [e["won"] for e in again[0].episodes] == [True, False, True, False], "a caller's edits stay its own"
    assert again[0].env_id == first[0].env_id


def test_what_changes_an_episode_plays_the_games(run):
    backend = WeightsBackend()
    run.evaluate(backend, lessons=[], episodes_per_env=4, split="train")
    count = played()
    cases = [
        {"lessons": ["Go."], "episodes_per_env": 4, "split": "train"},  # a lesson in the prompt
        {"lessons": [], "episodes_per_env": 3, "split": "train"},  # other tasks
        {"lessons": [], "episodes_per_env": 4, "split": "train", "first": 1},
        {"lessons": [], "episodes_per_env": 4, "split": "eval"},
        {"lessons": [], "episodes_per_env": 4, "split": "train", "context": "Be brief."},
        {"lessons": [], "episodes_per_env": 4, "split": "train", "slots": 1},
    ]
    for kwargs in cases:
        run.evaluate(backend, **kwargs)
        assert played() > count, kwargs
        count = played()
    run.evaluate(WeightsBackend(), lessons=[], episodes_per_env=4, split="train")
    assert played() > count, "another backend object: its weights are its own"
    count = played()
    # a lesson scoped to another environment leaves this one's prompt as it was: the games are not played again
    run.evaluate(backend, lessons=[ScopedLesson("Go.", ("textworld/other",))], episodes_per_env=4, split="train")
    assert played() == count


def test_other_weights_play_and_the_same_weights_do_not(run):
    backend = WeightsBackend()
    run.evaluate(backend, lessons=[], episodes_per_env=4)
    backend.load_adapter("cycle-1", "/a")
    backend.fingerprints["cycle-1"] = "f1"
    backend.use_adapter("cycle-1")
    run.evaluate(backend, lessons=[], episodes_per_env=4)
    assert played() == 8, "an adapter is other weights"
    backend.use_adapter(None)
    run.evaluate(backend, lessons=[], episodes_per_env=4)
    assert played() == 8, "back on the base model: what it played is known"
    # a rolled-back cycle's name reused by another adapter: told apart by its tensors' fingerprint
    backend.fingerprints["cycle-1"] = "f2"
    backend.use_adapter("cycle-1")
    run.evaluate(backend, lessons=[], episodes_per_env=4)
    assert played() == 12
    backend.fingerprints["cycle-1"] = None  # an adapter the backend cannot fingerprint: played every time
    run.evaluate(backend, lessons=[], episodes_per_env=4)
    run.evaluate(backend, lessons=[], episodes_per_env=4)
    assert played() == 20


def test_no_reuse_for_sampling_a_policy_without_fingerprints_or_a_caller_of_turns(tmp_path, run):
    run.evaluate(ScriptedBackend(seed=0), lessons=[], episodes_per_env=4)
    run.evaluate(ScriptedBackend(seed=0), lessons=[], episodes_per_env=4)
    assert played() == 8, "a backend that cannot say which weights it acts with"
    backend = WeightsBackend()
    turns = []
    run.evaluate(backend, lessons=[], episodes_per_env=4)
    run.evaluate(backend, lessons=[], episodes_per_env=4, on_record=turns.append)
    assert played() == 16 and len(turns) == 4, "a caller that reads the turns gets them played"
    sampled = Run(config(temperature=0.7), tmp_path, run.store, run.id, pool=run.pool)
    sampled.evaluate(backend, lessons=[], episodes_per_env=4)
    sampled.evaluate(backend, lessons=[], episodes_per_env=4)
    assert played() == 24, "sampling: each evaluation is a new draw"


def test_only_the_environments_not_played_yet_are_played_in_the_config_order(run):
    backend = WeightsBackend()
    other = {"id": f"{HERE}:ResetCountingEnv", "kwargs": {"tag": "b"}}
    run.evaluate(backend, lessons=[], episodes_per_env=4)
    both = run.evaluate(backend, envs=[other, *run.config.envs], lessons=[], episodes_per_env=4)
    assert (played("a"), played("b")) == (4, 4)
    assert [r.env_id for r in both] == [f"{HERE}:ResetCountingEnv"] * 2  # one id, two entries
    assert [[e["won"] for e in r.episodes] for r in both] == [[False, True, False, True], [True, False, True, False]]
