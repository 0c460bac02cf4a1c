"""One-step math episodes: the observation is a problem, the action is the whole answer.

`MathEnv` holds what every math source shares: reward 1 when `is_correct(action, gold)` and 0
otherwise, the episode ends after that one step, and the gold answer is revealed only in the final
step's info (so lesson extraction sees the outcome while the agent's prompt never contains it).
Subclasses supply the task ids and `problem(task_id) -> (question, gold)`.
"""

from __future__ import annotations

import importlib
from abc import abstractmethod
from types import ModuleType
from typing import Any

from environments.base import EnvError, EnvSpec
from environments.episodic import EpisodicEnv
from environments.math.grading import extract_final_answer, is_correct

GOAL = "Solve the problem. Reason step by step and give the final answer as \\boxed{answer}."


class MissingPackageError(EnvError):
    """An offline data package a math environment reads its problems from is not installed."""


def offline_package(module: str, distribution: str, env_id: str) -> ModuleType:
    """The offline data package `module` (pip distribution `distribution`), imported for `env_id`; a
    MissingPackageError that names it when it is not installed. A plain pip install of the project leaves
    these packages out (they cannot be ordinary dependencies); the runtime's setup command installs them."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != module.split(".")[0]:
            raise  # the package is there but something it imports is not: its own error says what
        raise MissingPackageError(
            f"{env_id} reads its problems from the Python package {distribution} (module {module}), which is not "
            f"installed here; run `agent-runtime setup`, which installs it with the other offline model and data "
            f"packages"
        ) from None


class MathEnv(EpisodicEnv):
    """A math problem set as a one-step TextEnv; subclasses provide tasks and problems."""

    def __init__(self, env_id: str, description: str, *, max_steps: int | None = None) -> None:
        super().__init__(
            EnvSpec(id=env_id, version="1", max_steps=1, family="math", description=description), max_steps=max_steps
        )
        self._gold: str | None = None

    @abstractmethod
    def problem(self, task_id: str) -> tuple[str, str]:
        """(question, gold answer) of a task."""

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        question, self._gold = self.problem(task_id)
        return question, {"goal": GOAL, "won": False, "score": 0.0}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        assert self._gold is not None
        won = is_correct(action, self._gold)
        feedback = "Correct." if won else "Incorrect."
        info = {"won": won, "score": float(won), "gold": self._gold, "answer": extract_final_answer(action)}
        return feedback, float(won), True, info

    def expert_actions(self) -> list[str]:
        """An answer that solves the current problem (the gold solution)."""
        if self._gold is None:
            raise RuntimeError(f"{self.spec.id}: call reset() before expert_actions()")
        return [self._gold if "####" in self._gold or "\\boxed" in self._gold else f"\\boxed{{{self._gold}}}"]

    def close(self) -> None:
        self._active = False
