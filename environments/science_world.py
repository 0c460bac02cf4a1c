"""ScienceWorld: `scienceworld/<task>` for its 30 tasks, on a JVM of its own (`environments/java.py`).

ScienceWorld is an elementary-science simulator in Scala (boil water, build a circuit, grow a plant, ...). This
adapter plays it through the `TextEnv` contract:

- **Tasks**: ScienceWorld's own variation folds. `train-<i>` is the i-th variation of its train fold, `eval-<i>`
  the i-th of its test fold (`eval_split="dev"`: its development fold), `validation-<i>` the i-th of its dev fold
  (of its test fold when eval plays dev).
- **An episode** starts as ScienceWorld's and TALES' do: the variation is loaded and reset, and the first
  observation is the answer to `look around`. The goal is the task description (`info["goal"]`).
- **Score and success**: `info["score"]` is ScienceWorld's score in points (0-100; `info["max_score"]` is 100) and
  the reward its difference from the last step. The episode ends when ScienceWorld says the task is complete or
  the score falls below zero (a failed task); `won` is a score of 100 (TALES' rule).
- **Admissible actions** are ScienceWorld's valid action-object combinations: several hundred to a few thousand
  per step (417 in the hallway), slower to list than to step. `admissible_actions=False` leaves them out, for agents
  that write actions freely (TALES' comparable protocol). `simplifications` is ScienceWorld's comma-separated
  list ("easy", "openDoors", ...; default none, as TALES plays it). `gold_path=True` has ScienceWorld plan a
  winning sequence at each reset (`expert_actions()`; a slower reset).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from environments.base import EnvError, EnvSpec
from environments.java import JavaGameEnv, JavaGameServer

ENTRY = "scienceworld.runtime.pythonapi.PythonInterface"
# ScienceWorld 1.2.3's tasks (its tasks.json): name -> what it asks
TASKS: dict[str, str] = {
    "boil": "Changes of State (Boiling)",
    "melt": "Changes of State (Melting)",
    "freeze": "Changes of State (Freezing)",
    "change-the-state-of-matter-of": "Changes of State (Any)",
    "use-thermometer": "Use Thermometer",
    "measure-melting-point-known-substance": "Measuring Melting Point (known)",
    "measure-melting-point-unknown-substance": "Measuring Melting Point (unknown)",
    "power-component": "Create a circuit",
    "power-component-renewable-vs-nonrenewable-energy": "Renewable vs Non-renewable Energy",
    "test-conductivity": "Test Conductivity (known)",
    "test-conductivity-of-unknown-substances": "Test Conductivity (unknown)",
    "find-living-thing": "Find a living thing",
    "find-non-living-thing": "Find a non-living thing",
    "find-plant": "Find a plant",
    "find-animal": "Find an animal",
    "grow-plant": "Grow a plant",
    "grow-fruit": "Grow a fruit",
    "chemistry-mix": "Mixing (generic)",
    "chemistry-mix-paint-secondary-color": "Mixing paints (secondary colours)",
    "chemistry-mix-paint-tertiary-color": "Mixing paints (tertiary colours)",
    "lifespan-longest-lived": "Identify longest-lived animal",
    "lifespan-shortest-lived": "Identify shortest-lived animal",
    "lifespan-longest-lived-then-shortest-lived": "Identify longest-then-shortest-lived animal",
    "identify-life-stages-1": "Identify life stages (plant)",
    "identify-life-stages-2": "Identify life stages (animal)",
    "inclined-plane-determine-angle": "Inclined Planes (determine angle)",
    "inclined-plane-friction-named-surfaces": "Friction (known surfaces)",
    "inclined-plane-friction-unnamed-surfaces": "Friction (unknown surfaces)",
    "mendelian-genetics-known-plant": "Mendelian Genetics (known plants)",
    "mendelian-genetics-unknown-plant": "Mendelian Genetics (unknown plants)",
}
MAX_STEPS = 100  # TALES' step limit per game
SIMPLIFICATIONS = (
    "easy",
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
)
# ScienceWorld lists a room's contents in hash-set order, and a JVM's identity hashes follow every object hashed
# before: the same variation listed its objects in another order after other games were played in the same JVM
# (check_env's reuse check caught it). A constant identity hash makes that order the order of creation, the same in
# every JVM and after any history, at a small cost per step (bench/RESULTS.md, "Environments").
DETERMINISTIC_ORDER = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
FOLD_CALLS = {"train": "getVariationsTrain", "dev": "getVariationsDev", "test": "getVariationsTest"}


def _jar() -> Path:
    from scienceworld import constants

    return Path(constants.JAR_PATH)


class ScienceWorldEnv(JavaGameEnv):
    """One ScienceWorld task, its variations as tasks (see the module docstring). `cache_dir` is accepted for
    uniformity with the other built-ins (nothing is cached)."""

    def __init__(
        self,
        task: str,
        *,
        eval_split: str = "test",
        simplifications: str = "",
        admissible_actions: bool = True,
        gold_path: bool = False,
        max_steps: int | None = None,
        heap: str = "2g",
        cache_dir: str | None = None,
    ) -> None:
        if task not in TASKS:
            raise EnvError(f"unknown ScienceWorld task {task!r}; known: {', '.join(TASKS)}")
        unknown = [s for s in str(simplifications).split(",") if s and s not in SIMPLIFICATIONS]
        if not isinstance(simplifications, str) or unknown:
            raise EnvError(
                f"scienceworld/{task}: simplifications is a comma-separated string of {', '.join(SIMPLIFICATIONS)}; "
                f"got {simplifications!r:.80}"
            )
        if "noElectricalAction" in simplifications and ("power-component" in task or "conductivity" in task):
            raise EnvError(f"scienceworld/{task} needs electrical actions: drop noElectricalAction")
        self.task, self.simplifications = task, simplifications
        self.list_admissible, self.gold_path = bool(admissible_actions), bool(gold_path)
        spec = EnvSpec(
            id=f"scienceworld/{task}",
            version="1",
            max_steps=MAX_STEPS,
            family="text",
            description=f"ScienceWorld: {TASKS[task]}",
            kwargs={"eval_split": eval_split, "simplifications": simplifications},
        )
        super().__init__(spec, eval_split=eval_split, max_steps=max_steps)
        self.server = JavaGameServer(_jar(), ENTRY, name=spec.id, heap=heap, java_options=DETERMINISTIC_ORDER)
        self._score = 0
        self._goal = ""
        self._gold: list[str] = []

    def _fold_key(self) -> str:
        return self.task

    def _read_folds(self) -> dict[str, list[int]]:
        self._load(0, gold=False)  # the folds are the task's, whichever variation is loaded
        return {fold: [int(v) for v in self.server.call(call)] for fold, call in FOLD_CALLS.items()}

    def _load(self, variation: int, *, gold: bool) -> None:
        # objects are numbered from a JVM-wide counter that no load resets: the same variation gets the same numbers
        self.server.call("reset", on="util.UniqueIdentifier")
        try:
            self.server.call("load", self.task, variation, self.simplifications, gold)
        except EnvError as error:
            raise EnvError(f"{self.spec.id}: ScienceWorld refused to load variation {variation}: {error}") from None

    def _state(self, observation: str) -> tuple[str, dict[str, Any]]:
        score = round(100 * float(self.server.call("getScore")))
        info: dict[str, Any] = {"won": score >= 100, "score": float(score), "max_score": 100.0, "goal": self._goal}
        if self.list_admissible:
            valid = json.loads(self.server.call("getValidActionObjectCombinationsJSON"))["validActions"]
            info["admissible_actions"] = sorted({str(entry["action"]) for entry in valid})  # the game's order varies
        return str(observation), info

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        _, variation = self.fold_entry(task_id)
        self._load(variation, gold=self.gold_path)
        self.server.call("reset")
        self._goal = str(self.server.call("freeActionTaskDesc")).strip().removeprefix("Task Description:").strip()
        self._gold = [str(a) for a in self.server.call("getGoldActionSequence")] if self.gold_path else []
        observation, info = self._state(self.server.call("step", "look around"))
        self._score = int(info["score"])
        return observation, info

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        observation, info = self._state(self.server.call("step", action))
        score = int(info["score"])
        reward, self._score = score - self._score, score
        terminated = bool(self.server.call("getCompleted")) or score < 0
        return observation, float(reward), terminated, info

    def expert_actions(self) -> list[str]:
        """ScienceWorld's gold action sequence for the current episode (needs `gold_path=True`)."""
        if self.task_id is None:
            raise RuntimeError(f"{self.spec.id}: call reset() before expert_actions()")
        if not self.gold_path:
            raise RuntimeError(f"{self.spec.id}: make it with gold_path=True to have expert actions")
        return list(self._gold)
