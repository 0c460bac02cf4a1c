"""Plugin rooms whose validation fold is wrong on purpose, for the check that refuses a decision fold which shares a
game with the train or held-out ones: one whose validation ids are the eval ids, one whose validation games are the
held-out games under other ids (each game opens with its number, so an opening identifies it), one whose validation
fold is short."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from environments.episodic import IndexedTasks, parse_indexed_task
from tests.continual_envs import LeftRoom


class NumberedRoom(LeftRoom):
    """Every game opens with its own number: train-i is game i, eval-i game 1000 + i, validation-i game 2000 + i."""

    offsets: ClassVar[dict[str, int]] = {"train": 0, "eval": 1000, "validation": 2000}

    def _game(self, task_id: str) -> int:
        split = next(s for s in self.offsets if parse_indexed_task(task_id, s) is not None)
        return self.offsets[split] + parse_indexed_task(task_id, split)

    def _reset(self, task_id: str):
        observation, info = super()._reset(task_id)
        return f"Room {self._game(task_id)}. {observation}", info


class ValidationIsEval(NumberedRoom):
    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks("eval" if split == "validation" else split, self.tasks_per_split)


class ValidationRepeatsHeldOut(NumberedRoom):
    offsets: ClassVar[dict[str, int]] = {"train": 0, "eval": 1000, "validation": 1000}


class ShortValidation(NumberedRoom):
    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, 3 if split == "validation" else self.tasks_per_split)


EVAL_IDS, SAME_GAMES, SHORT = (
    f"tests.folds_envs:{name}" for name in ("ValidationIsEval", "ValidationRepeatsHeldOut", "ShortValidation")
)
