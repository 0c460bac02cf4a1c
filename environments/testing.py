"""Test doubles that ship with the package: a tiny deterministic game, a deliberately faulty one, and one-move rooms.

`GuessEnv` is the smallest complete environment (the docs' example has the same shape): guess a
number in [1, 5] with "higher"/"lower" hints. `FaultyEnv` raises in reset or step on purpose, so the
runtime's tests can check that a plugin's exception is recorded as an errored episode and the run
goes on. Both are reachable without registration: ``make("environments.testing:GuessEnv")``.
`OneMoveEnv` is a room where one of a few actions wins and the others lose, in one move: tests subclass it (which
action wins, what the room says) to give the lesson gate, induction and lesson scopes a game whose right answer
they know.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from environments.base import SPLITS, EnvSpec
from environments.episodic import EpisodicEnv, IndexedTasks, parse_indexed_task


class GuessEnv(EpisodicEnv):
    """Guess the hidden number in [1, 5]; reward 1 on the right guess; hints "higher"/"lower"."""

    splits = SPLITS

    def __init__(self, *, max_steps: int | None = None, cache_dir: str | None = None) -> None:
        super().__init__(
            EnvSpec(id="testing/guess", max_steps=4, family="text", description="Guess a number between 1 and 5"),
            max_steps=max_steps,
        )
        self._secret = 0

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, 20 if split == "train" else 5)

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        split = next(split for split in self.splits if parse_indexed_task(task_id, split) is not None)
        self._secret = random.Random(f"{split}/{parse_indexed_task(task_id, split)}").randint(1, 5)
        return "I am thinking of a number between 1 and 5.", self._info(False)

    def _info(self, won: bool) -> dict[str, Any]:
        return {"admissible_actions": [str(n) for n in range(1, 6)], "won": won, "goal": "Guess the number."}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        guess = action.strip()
        if not guess.isdigit():
            return "Please answer with a number from 1 to 5.", 0.0, False, self._info(False)
        if int(guess) == self._secret:
            return "Right!", 1.0, True, self._info(True)
        return ("Higher." if int(guess) < self._secret else "Lower."), 0.0, False, self._info(False)

    def expert_actions(self) -> list[str]:
        return [str(self._secret)]


class FaultyEnv(GuessEnv):
    """A GuessEnv that raises RuntimeError in `fail_on` ("reset" or "step"), for error-handling tests."""

    def __init__(self, *, fail_on: str = "step", max_steps: int | None = None, cache_dir: str | None = None) -> None:
        if fail_on not in ("reset", "step"):
            raise ValueError(f"fail_on must be 'reset' or 'step', got {fail_on!r}")
        super().__init__(max_steps=max_steps, cache_dir=cache_dir)
        self.fail_on = fail_on

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        if self.fail_on == "reset":
            raise RuntimeError("FaultyEnv: failing in reset on purpose")
        return super()._reset(task_id)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.fail_on == "step":
            raise RuntimeError("FaultyEnv: failing in step on purpose")
        return super()._step(action)


class OneMoveEnv(EpisodicEnv):
    """One move: `winner` wins, any other of `actions` loses. Subclasses set the class attributes."""

    spec = EnvSpec(id="testing/one-move", max_steps=1, family="text")
    splits = SPLITS
    actions: tuple[str, ...] = ("look", "wait")
    winner = "wait"
    observation = "A room."
    goal: str | None = None
    tasks_per_split = 8

    def __init__(self, cache_dir: str | None = None) -> None:
        super().__init__(self.spec, max_steps=1)

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, self.tasks_per_split)

    def _info(self, won: bool) -> dict[str, Any]:
        info: dict[str, Any] = {"admissible_actions": list(self.actions), "won": won}
        if self.goal is not None:
            info["goal"] = self.goal
        return info

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        return self.observation, self._info(False)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        won = action.strip() == self.winner
        return ("Done." if won else "Nothing happens."), float(won), True, self._info(won)
