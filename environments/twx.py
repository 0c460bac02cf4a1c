"""TextWorld Express: `twx/<game>` for its eight games, with the TALES suite's game parameters as defaults.

TextWorld Express (TWX) reimplements TextWorld-style games in Scala, one JVM serving many games at thousands of
steps a second (`environments/java.py` runs the JVM). This adapter plays them through the `TextEnv` contract:

- **Tasks**: TWX's own seed folds. `train-<i>` is the i-th seed of TWX's train fold; `eval-<i>` the i-th of its
  test fold (`eval_split="dev"`: its development fold), `validation-<i>` the i-th of its dev fold (of its test fold
  when eval plays dev). The folds draw on disjoint objects and layouts, as TWX designed them, so held-out games are
  new games.
- **Parameters**: TALES' settings per game (`GAMES`, from the suite's `twx_data.py`); `params={...}` overrides
  any of them (`params={"numLocations": 3}`). TALES' SimonSays variants are `simonsays` with `gameLength` 10, 50
  or 100, `memorization` 0 or 1 and `verbose` 0 or 1.
- **TALES' games**: each of the suite's sixteen (`TALES_GAMES`) is also a built-in of its own, `tales/<name>`
  (`tales/TWXSimonSaysWithMemory50`: `twx/simonsays` with those parameters), for configs that play several.
- **What the agent sees**: the observation is the game's; the goal is its task description (`info["goal"]`);
  admissible actions are TWX's `validActions`; `won` is its `tasksuccess`, and the episode ends on success or on
  `taskfailure`. `info["score"]` is TWX's score (normalised by the game to at most 1; `info["max_score"]` is 1),
  and the reward is its difference from the last step. `spec.max_steps` is 100, TALES' step limit.
- An invalid action is answered by the game ("I'm not sure what you mean"), never an exception. A line with a
  newline is one action for TWX as for TALES ("one action per step"): it is passed through and the game answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from environments.base import EnvError, EnvSpec
from environments.java import JavaGameEnv, JavaGameServer

ENTRY = "textworldexpress.runtime.PythonInterface"
# TALES' parameters per game (tale-suite, tales/textworld_express/twx_data.py); TWX's own defaults otherwise
GAMES: dict[str, dict[str, int]] = {
    "cookingworld": {
        "numLocations": 1,
        "numIngredients": 2,
        "numDistractorItems": 5,
        "includeDoors": 0,
        "limitInventorySize": 0,
    },
    "twc": {"numLocations": 1, "numItemsToPutAway": 1, "includeDoors": 0, "limitInventorySize": 0},
    "coin": {"numLocations": 1, "numDistractorItems": 5, "limitInventorySize": 0},
    "arithmetic": {},
    "mapreader": {
        "numLocations": 2,
        "maxDistanceApart": 1,
        "maxDistractorItemsPerLocation": 2,
        "includeDoors": 0,
        "limitInventorySize": 0,
    },
    "sorting": {},
    "simonsays": {"gameLength": 10, "numDistractors": 4, "memorization": 0},
    "peckingorder": {},
}
DESCRIPTIONS = {
    "cookingworld": "TextWorld Express CookingWorld: read the cookbook, gather and prepare the ingredients, eat",
    "twc": "TextWorld Express TextWorld Commonsense: put the misplaced item where it belongs",
    "coin": "TextWorld Express Coin Collector: find the coin and take it",
    "arithmetic": "TextWorld Express Arithmetic: solve the math problem, put the item of that quantity in the box",
    "mapreader": "TextWorld Express Map Reader: fetch the coin from the named room using the map",
    "sorting": "TextWorld Express Sorting: put the objects in the box from smallest quantity to largest",
    "simonsays": "TextWorld Express Simon Says: do exactly what Simon says",
    "peckingorder": "TextWorld Express Pecking Order: follow the instructions book, one step at a time",
}
# TALES' sixteen TWX games, each registered as `tales/<name>` (environments.builtin): name -> (game, its parameters
# beyond GAMES'), so that the nine Simon Says variants of one game stand side by side in one config (a config names
# an environment id once)
_SIMON = {"gameLength": 10, "numDistractors": 4, "memorization": 0}
TALES_GAMES: dict[str, tuple[str, dict[str, int]]] = {
    "TWXCookingWorld": ("cookingworld", {}),
    "TWXTextWorldCommonsense": ("twc", {}),
    "TWXCoinCollector": ("coin", {}),
    "TWXArithmetic": ("arithmetic", {}),
    "TWXMapReader": ("mapreader", {}),
    "TWXSorting": ("sorting", {}),
    **{f"TWXSimonSays{n}": ("simonsays", {**_SIMON, "gameLength": n}) for n in (10, 50, 100)},
    **{
        f"TWXSimonSaysWithMemory{n}": ("simonsays", {**_SIMON, "gameLength": n, "memorization": 1, "verbose": 0})
        for n in (10, 50, 100)
    },
    **{
        f"TWXSimonSaysWithMemory{n}Verbose": (
            "simonsays",
            {**_SIMON, "gameLength": n, "memorization": 1, "verbose": 1},
        )
        for n in (10, 50, 100)
    },
    "TWXPeckingOrder": ("peckingorder", {}),
}
MAX_STEPS = 100  # TALES' step limit per game
_PARAM_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


def _package_files() -> tuple[Path, list[Path]]:
    """TWX's jar and the data files it reads from its working directory."""
    from textworld_express import constants

    base = Path(constants.BASEPATH)
    return Path(constants.JAR_PATH), sorted(base.glob("*.json"))


def param_string(params: Mapping[str, int]) -> str:
    """TWX's "name=value,name=value" form of a parameter mapping."""
    return ",".join(f"{name}={value}" for name, value in params.items())


def _check_params(game: str, params: Mapping[str, Any] | None) -> dict[str, int]:
    if params is None:
        return dict(GAMES[game])
    if not isinstance(params, Mapping):
        raise EnvError(f"twx/{game}: params must be a mapping of parameter name to integer, got {params!r:.80}")
    merged = dict(GAMES[game])
    for name, value in params.items():
        if not isinstance(name, str) or not _PARAM_NAME.match(name):
            raise EnvError(f"twx/{game}: parameter names are TWX's camelCase names (numLocations), got {name!r:.80}")
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int):
            raise EnvError(f"twx/{game}: parameter {name} must be an integer, got {value!r:.80}")
        merged[name] = value
    return merged


class TwxEnv(JavaGameEnv):
    """One TWX game with fixed parameters, on a JVM of its own (see the module docstring). `cache_dir` is accepted
    for uniformity with the other built-ins: TWX generates its games in memory and writes nothing."""

    def __init__(
        self,
        game: str,
        *,
        params: Mapping[str, int] | None = None,
        eval_split: str = "test",
        max_steps: int | None = None,
        heap: str = "512m",
        cache_dir: str | None = None,
    ) -> None:
        if game not in GAMES:
            raise EnvError(f"unknown TextWorld Express game {game!r}; known: {', '.join(GAMES)}")
        self.game, self.params = game, _check_params(game, params)
        spec = EnvSpec(
            id=f"twx/{game}",
            version="1",
            max_steps=MAX_STEPS,
            family="text",
            description=DESCRIPTIONS[game],
            kwargs={"params": dict(self.params), "eval_split": eval_split},
        )
        super().__init__(spec, eval_split=eval_split, max_steps=max_steps)
        jar, data = _package_files()
        self.server = JavaGameServer(jar, ENTRY, name=spec.id, data_files=data, heap=heap)
        self._loaded_in = 0  # the server start (server.starts) the game was loaded into
        self._score = 0.0
        self._goal = ""
        self._gold: list[str] = []

    # -- the game on the JVM ---------------------------------------------------------------
    def _load(self) -> None:
        """Load the game into the JVM (again after the JVM was replaced)."""
        if self._loaded_in and self._loaded_in == self.server.starts and self.server.running:
            return
        message = self.server.call("load", self.game, param_string(self.params))
        if message:
            raise EnvError(f"{self.spec.id}: TextWorld Express refused the parameters {self.params}: {message}")
        self._loaded_in = self.server.starts

    def _fold_key(self) -> str:
        return f"{self.game}:{param_string(self.params)}"

    def _read_folds(self) -> dict[str, list[int]]:
        self._load()
        calls = {"train": "getSeedsTrain", "dev": "getSeedsDev", "test": "getSeedsTest"}
        return {fold: [int(s) for s in self.server.call(call)] for fold, call in calls.items()}

    def _info(self, state: dict[str, Any], goal: str) -> dict[str, Any]:
        return {
            "admissible_actions": [str(a) for a in state.get("validActions", [])],
            "won": bool(state.get("tasksuccess", False)),
            "score": float(state.get("score", 0.0)),
            "max_score": 1.0,
            "goal": goal,
        }

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        fold, seed = self.fold_entry(task_id)
        self._load()
        state = json.loads(self.server.call("generateNewGameJSON", seed, fold, True))
        self._goal = str(self.server.call("getTaskDescription"))
        self._gold = [str(a) for a in self.server.call("getGoldActionSequence")]
        self._score = float(state.get("score", 0.0))
        return str(state["observation"]), self._info(state, self._goal)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        state = json.loads(self.server.call("stepJSON", action))
        score = float(state.get("score", 0.0))
        reward, self._score = score - self._score, score
        terminated = bool(state.get("tasksuccess", False) or state.get("taskfailure", False))
        return str(state["observation"]), reward, terminated, self._info(state, self._goal)

    def expert_actions(self) -> list[str]:
        """TWX's gold action sequence from the start of the current episode."""
        if self.task_id is None:
            raise RuntimeError(f"{self.spec.id}: call reset() before expert_actions()")
        return list(self._gold)

    def close(self) -> None:
        super().close()
        self._loaded_in = 0
