"""One-move games for the continual-learning tests: the left door wins in one, the right door in the other, so
one lesson ("Always reply: left") helps the first and hurts the second; in the third, the left door wins the even
tasks and the right door the odd ones, so either lesson alone wins half of them."""

from __future__ import annotations

from environments.base import EnvSpec
from environments.episodic import parse_indexed_task
from environments.testing import OneMoveEnv


class LeftRoom(OneMoveEnv):
    spec = EnvSpec(id="tests/left-room", max_steps=1, family="text")
    actions = ("left", "right", "wait")
    winner = "left"
    observation = "Two doors, a red hall."
    goal = "Leave the red hall by the right door."
    tasks_per_split = 12


class RightRoom(LeftRoom):
    spec = EnvSpec(id="tests/right-room", max_steps=1, family="text")
    winner = "right"
    observation = "Two doors, a blue cellar."
    goal = "Leave the blue cellar by the right door."


class MixedRoom(LeftRoom):
    spec = EnvSpec(id="tests/mixed-room", max_steps=1, family="text")
    observation = "Two doors, a grey landing."
    goal = "Leave the grey landing by the open door."

    def _reset(self, task_id: str):
        index = next(i for split in ("train", "eval", "test") if (i := parse_indexed_task(task_id, split)) is not None)
        self.winner = "left" if index % 2 == 0 else "right"
        return super()._reset(task_id)


LEFT, RIGHT = "tests.continual_envs:LeftRoom", "tests.continual_envs:RightRoom"
MIXED = "tests.continual_envs:MixedRoom"
