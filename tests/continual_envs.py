"""Two one-move games for the continual-learning tests: the left door wins in one, the right door in the other, so
one lesson ("Always reply: left") helps the first and hurts the second."""

from __future__ import annotations

from environments.base import EnvSpec
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


LEFT, RIGHT = "tests.continual_envs:LeftRoom", "tests.continual_envs:RightRoom"
