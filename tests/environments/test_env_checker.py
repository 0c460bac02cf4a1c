"""check_env catches each kind of contract violation (on deliberately broken copies of a tiny game)."""

from __future__ import annotations

import random

import pytest

import environments
from environments.base import StepResult
from environments.checker import env_failures
from environments.testing import GuessEnv


class StepsBeforeReset(GuessEnv):
    def step(self, action):
        if not self._active and self._task_id is None:
            return StepResult("ok", 0.0, False, False, {})
        return super().step(action)


class NanReward(GuessEnv):
    def _step(self, action):
        observation, _, terminated, info = super()._step(action)
        return observation, float("nan"), terminated, info


class RandomOnReset(GuessEnv):
    def _reset(self, task_id):
        observation, info = super()._reset(task_id)
        return f"{observation} ({random.random()})", info


class NeverTruncates(GuessEnv):
    def _step(self, action):
        return "Nope.", 0.0, False, self._info(False)

    def step(self, action):
        result = super().step(action)
        self._active = True  # keeps going past max_steps
        return result._replace(truncated=False)


class BothFlags(GuessEnv):
    def step(self, action):
        result = super().step(action)
        return result._replace(terminated=True, truncated=True)


class NumbersAsActions(GuessEnv):
    def _info(self, won):
        return {**super()._info(won), "admissible_actions": [1, 2, 3]}


class CrashesOnNonsense(GuessEnv):
    def _step(self, action):
        if not action.strip().isdigit():
            raise ValueError("cannot parse")
        return super()._step(action)


class CloseOnce(GuessEnv):
    closed = False

    def close(self):
        if self.closed:
            raise RuntimeError("already closed")
        self.closed = True


CASES = [
    (StepsBeforeReset, "before reset() must raise ResetNeededError"),
    (NanReward, "reward must be finite"),
    (RandomOnReset, "twice gave different observations"),
    (NeverTruncates, "the episode must end (truncated=True)"),
    (BothFlags, "terminated and truncated are both True"),
    (NumbersAsActions, "admissible_actions'] must be a list of str"),
    (CrashesOnNonsense, "unexpected ValueError: cannot parse"),
    (CloseOnce, "unexpected RuntimeError: already closed"),
]


def test_the_reference_game_conforms():
    assert env_failures(GuessEnv()) == []
    environments.check_env(GuessEnv())


@pytest.mark.parametrize("cls,expected", CASES, ids=[c.__name__ for c, _ in CASES])
def test_violation_is_reported(cls, expected):
    failures = env_failures(cls())
    assert any(expected in f for f in failures), failures
    with pytest.raises(environments.EnvCheckError, match="fails"):
        environments.check_env(cls())


def test_cli_check_reports_instead_of_raising():
    failures = environments.cli_check(f"{__name__}:NanReward", episodes=2)
    assert failures and all(isinstance(f, str) for f in failures)
    assert environments.cli_check("environments.testing:GuessEnv", episodes=3) == []
    assert environments.cli_check("environments.testing:FaultyEnv", fail_on="reset")[0].startswith("unexpected")


class FailsOnSecondTask(GuessEnv):
    def _reset(self, task_id):
        if task_id == "train-1":
            raise RuntimeError("cannot load train-1")
        return super()._reset(task_id)


def test_failed_reset_leaves_no_episode_to_step():
    env = FailsOnSecondTask()
    env.reset(task_id="train-0")
    with pytest.raises(RuntimeError, match="cannot load"):
        env.reset(task_id="train-1")
    with pytest.raises(environments.ResetNeededError):
        env.step("1")
