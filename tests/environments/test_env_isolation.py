"""No state crosses from one episode to the next: `check_env` catches an environment whose reset
leaves something of the last episode behind, naming the step where a reused instance played differently from a
fresh one, and the evaluation pool never lends an instance across splits, so a train-split evaluation cannot change
what a held-out one scores."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import environments
from agent_runtime.config import config_from_dict
from agent_runtime.evaluation import EnvPool, evaluate
from agent_runtime.llm.scripted import ScriptedBackend
from environments.base import SPLITS, EnvSpec
from environments.checker import env_failures
from environments.episodic import EpisodicEnv, IndexedTasks

LEAKY = f"{__name__}:LeakyKeyEnv"


class LeakyKeyEnv(EpisodicEnv):
    """A locked door: train rooms have a key to take, eval rooms do not. `reset` forgets to drop the key, so an
    instance that played a train room opens every eval door (the plugin bug of the review)."""

    splits = SPLITS

    def __init__(self, *, cache_dir: str | None = None, max_steps: int | None = None) -> None:
        super().__init__(EnvSpec(id="tests/leaky-key", max_steps=3, family="text"), max_steps=max_steps)
        self.has_key = False
        self._key_here = False

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, 5)

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._key_here = task_id.startswith("train")  # the bug: self.has_key is not reset
        return self._room()

    def _room(self) -> tuple[str, dict[str, Any]]:
        if self._key_here:
            return "A locked door. A key lies here.", {"admissible_actions": ["take key"], "won": False}
        return "A locked door.", {"admissible_actions": ["open door"], "won": False}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if action == "take key" and self._key_here:
            self._key_here, self.has_key = False, True
            return "Taken.", 0.0, False, self._room()[1]
        if action == "open door":
            won = self.has_key
            return ("The door opens." if won else "The door is locked. You give up."), float(won), True, {"won": won}
        return "Nothing happens.", 0.0, False, self._room()[1]


class TidyKeyEnv(LeakyKeyEnv):
    """The same game with the bug fixed: the key goes with the episode."""

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self.has_key = False
        return super()._reset(task_id)


def test_check_env_catches_state_kept_across_reset():
    failures = env_failures(LeakyKeyEnv())
    [leak] = [f for f in failures if "reused instance" in f]
    assert "step 1 ('open door')" in leak and "eval-0" in leak and "train-0" in leak
    assert "The door opens." in leak and "The door is locked." in leak
    assert "depends only on (task_id, seed)" in leak
    with pytest.raises(environments.EnvCheckError, match="reused instance"):
        environments.check_env(LeakyKeyEnv())
    assert env_failures(TidyKeyEnv()) == []


def test_envs_check_reports_the_leak():
    """What `agent-runtime envs check` runs: no longer "ok" for the leaky plugin."""
    assert any("reused instance" in f for f in environments.cli_check(LEAKY, episodes=1))
    assert environments.cli_check(f"{__name__}:TidyKeyEnv", episodes=1) == []


def leaky_config():
    return config_from_dict(
        {
            "name": "leak",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [{"id": LEAKY}],
            "runtime": {"slots": 2},
            "evaluation": {"episodes_per_env": 5},
        }
    )


def scores(results) -> list[tuple[str, int, int]]:
    return [(r.env_id, r.successes, r.n) for r in results]


def test_a_train_split_evaluation_does_not_lend_to_a_held_out_one(tmp_path):
    """The review's repro: held-out 0/5 on a fresh pool, 5/5 on one that had just evaluated the train split. The
    pool keeps each split's instances apart, so the held-out score is the fresh pool's however the pool was used."""
    fresh = scores(evaluate(leaky_config(), tmp_path, ScriptedBackend(), pool=EnvPool()))
    assert fresh == [(LEAKY, 0, 5)]
    pool = EnvPool()
    train = evaluate(leaky_config(), tmp_path, ScriptedBackend(), pool=pool, split="train")
    assert scores(train) == [(LEAKY, 5, 5)]  # every train instance now holds a key
    assert scores(evaluate(leaky_config(), tmp_path, ScriptedBackend(), pool=pool)) == fresh
    assert pool.idle() == 4  # two instances per split, each waiting for its own split
    reused = pool.reused
    evaluate(leaky_config(), tmp_path, ScriptedBackend(), pool=pool, split="train", episodes_per_env=1)
    assert pool.reused == reused + 1  # a split's instances are still lent to that split


class KeyBehindOneActionEnv(EpisodicEnv):
    """One move a room. A train room has many things to do and one of them, "pull brick", finds a key behind a loose
    brick; an eval room's door opens with the key. `reset` forgets to drop the key, so only an instance whose train
    episode began with that one action carries it into every eval room: a random trace all but never finds it."""

    CHORES = ("look", "wait", "listen", "sing", "jump", "pull brick", "knock", "sleep")

    def __init__(self, *, cache_dir: str | None = None, max_steps: int | None = None) -> None:
        super().__init__(EnvSpec(id="tests/key-behind-brick", max_steps=1, family="text"), max_steps=max_steps)
        self.has_key = False
        self._train = False

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, 3)

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._train = task_id.startswith("train")  # the bug: self.has_key is not reset
        if self._train:
            return "A bare room with a loose brick.", {"admissible_actions": list(self.CHORES), "won": False}
        return "A locked door.", {"admissible_actions": ["open door"], "won": False}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._train:
            if action == "pull brick":
                self.has_key = True
                return "A key falls out. You leave.", 0.0, True, {"won": False}
            return "You leave.", 0.0, True, {"won": False}
        won = action == "open door" and self.has_key
        return ("The door opens." if won else "The door is locked."), float(won), True, {"won": won}


def test_check_env_finds_state_that_one_first_action_carries_across_reset():
    failures = env_failures(KeyBehindOneActionEnv())
    [leak] = [f for f in failures if "reused instance" in f]
    assert "'pull brick' as the first action of 'train-0'" in leak and "eval-0" in leak
    assert "The door opens." in leak and "The door is locked." in leak
    assert any("reused instance" in f for f in environments.cli_check(f"{__name__}:KeyBehindOneActionEnv"))
