"""The built-in environments, as a table (`BUILTINS`) that the registry registers on first use.

A table, not registrations: this module imports nothing of the registry, which imports it (lazily, in
`registry._builtins`), so the two never import each other. Entry points are lazy "module:attr" strings so that
listing environments imports none of the game libraries. Every built-in accepts `max_steps=None` (override of
spec.max_steps) and `cache_dir=None` (where generated games are cached; default ~/.cache/agent-runtime/games).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from environments.science_world import TASKS as _SCIENCEWORLD_TASKS
from environments.twx import DESCRIPTIONS as _TWX_DESCRIPTIONS
from environments.twx import TALES_GAMES as _TALES_GAMES


class Builtin(NamedTuple):
    """One built-in environment: `registry.register`'s arguments."""

    id: str
    entry_point: str
    description: str
    defaults: dict[str, Any]


BUILTINS: list[Builtin] = []


def _builtin(id: str, entry_point: str, *, description: str, **defaults: Any) -> None:
    BUILTINS.append(Builtin(id, entry_point, description, defaults))


_TW = "environments.textworld_games"
_builtin(
    "textworld/coin_collector",
    f"{_TW}:coin_collector",
    description="TextWorld Coin Collector: walk a chain of rooms and take the coin",
)
_builtin(
    "textworld/treasure_hunter",
    f"{_TW}:treasure_hunter",
    description="TextWorld Treasure Hunter: find the named object among distractors",
)
_builtin(
    "textworld/cooking", f"{_TW}:cooking", description="TextWorld cooking: read the cookbook, prepare and eat the meal"
)
_builtin(
    "textworld/simple", f"{_TW}:simple", description="TextWorld simple: a fixed house, bring the food to the stove"
)
_builtin(
    "textworld/custom",
    f"{_TW}:custom",
    description="TextWorld custom: a generated world with a quest of a given length",
)

_builtin(
    "math/gsm_symbolic",
    "environments.math.gsm_symbolic:GsmSymbolicEnv",
    description="GSM-Symbolic: fresh grade-school word problems by seed (offline)",
)

_builtin(
    "textarena/frozenlake",
    "environments.textarena_games:frozenlake",
    description="TextArena FrozenLake 3x3 with 2 holes, at most 5 turns (OPCD paper setting)",
)
_builtin(
    "textarena/sokoban",
    "environments.textarena_games:sokoban",
    description="TextArena Sokoban 6x6 with 1 box, at most 5 turns (OPCD paper setting)",
)

_TWX = "environments.twx"
for _game in _TWX_DESCRIPTIONS:  # the modules import no game library until an environment is made
    _builtin(f"twx/{_game}", f"{_TWX}:TwxEnv", description=_TWX_DESCRIPTIONS[_game], game=_game)
for _name, (_game, _extra) in _TALES_GAMES.items():  # TALES' variants, one id each
    _builtin(
        f"tales/{_name}",
        f"{_TWX}:TwxEnv",
        description=f"TALES' {_name}: twx/{_game} with {_extra or 'its TALES parameters'}",
        game=_game,
        **({"params": _extra} if _extra else {}),
    )

for _task, _what in _SCIENCEWORLD_TASKS.items():
    _builtin(
        f"scienceworld/{_task}",
        "environments.science_world:ScienceWorldEnv",
        description=f"ScienceWorld: {_what} (variations as tasks)",
        task=_task,
    )

_MATH = "environments.math.sources"
_builtin(
    "math/gsm8k",
    f"{_MATH}:gsm8k",
    description="GSM8K word problems (Hugging Face `datasets`, or a local JSONL/Parquet via path=)",
)
_builtin(
    "math/math",
    f"{_MATH}:competition_math",
    description="MATH competition problems (Hugging Face `datasets`, or a local file via path=)",
)
_builtin("math/dapo", f"{_MATH}:dapo", description="DAPO-Math-17k (Hugging Face `datasets`, or a local file via path=)")
_builtin("math/champ", f"{_MATH}:champ", description="CHAMP competition math problems (offline)")

_QA = "environments.qa.sources"
_builtin(
    "qa/medmcqa",
    f"{_QA}:medmcqa",
    description="MedMCQA multiple choice, A-D (the OPCD paper's export via `datasets`, or a local file via path=)",
)
_builtin(
    "qa/safety",
    f"{_QA}:safety",
    description="The OPCD paper's safety yes/no set (its export via `datasets`, or a local file via path=)",
)

_builtin(
    "alfworld/text",
    "environments.alfworld.env:AlfworldEnv",
    description="ALFWorld household tasks (official data via ALFWORLD_DATA, else generated offline)",
)
