"""Two one-move games for the continual-learning tests: the left door wins in one, the right door in the other, so
one lesson ("Always reply: left") helps the first and hurts the second."""

from __future__ import annotations

from environments.base import EnvSpec, TextEnv

DOORS = ["left", "right", "wait"]


class _Doors(TextEnv):
    winner = ""

    def __init__(self, cache_dir=None):
        self._task = ""

    def tasks(self, split):
        return [f"{split}-{i}" for i in range(12)]

    def reset(self, *, seed=None, task_id=None):
        self._task = task_id or ""
        return f"Two doors, {self.spec.description}. Task {self._task}.", {
            "admissible_actions": list(DOORS),
            "goal": f"Leave the {self.spec.description} by the right door.",
        }

    def step(self, action):
        won = action.strip() == self.winner
        return ("You are out." if won else "Nothing happens."), float(won), True, False, {"won": won}


class LeftRoom(_Doors):
    spec = EnvSpec(id="tests/left-room", max_steps=1, family="text", description="a red hall")
    winner = "left"


class RightRoom(_Doors):
    spec = EnvSpec(id="tests/right-room", max_steps=1, family="text", description="a blue cellar")
    winner = "right"


LEFT, RIGHT = "tests.continual_envs:LeftRoom", "tests.continual_envs:RightRoom"
