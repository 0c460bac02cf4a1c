"""Registrations of the built-in environments (imported by the registry on first use).

Entry points are lazy "module:attr" strings so that listing environments imports none of the game
libraries. Every built-in accepts `max_steps=None` (override of spec.max_steps) and `cache_dir=None`
(where generated games are cached; default ~/.cache/agent-runtime/games).
"""

from environments.registry import register
from environments.science_world import TASKS as _SCIENCEWORLD_TASKS
from environments.twx import DESCRIPTIONS as _TWX_DESCRIPTIONS

_TW = "environments.textworld_games"
register(
    "textworld/coin_collector",
    f"{_TW}:coin_collector",
    description="TextWorld Coin Collector: walk a chain of rooms and take the coin",
)
register(
    "textworld/treasure_hunter",
    f"{_TW}:treasure_hunter",
    description="TextWorld Treasure Hunter: find the named object among distractors",
)
register(
    "textworld/cooking", f"{_TW}:cooking", description="TextWorld cooking: read the cookbook, prepare and eat the meal"
)
register(
    "textworld/simple", f"{_TW}:simple", description="TextWorld simple: a fixed house, bring the food to the stove"
)
register(
    "textworld/custom",
    f"{_TW}:custom",
    description="TextWorld custom: a generated world with a quest of a given length",
)

register(
    "math/gsm_symbolic",
    "environments.math.gsm_symbolic:GsmSymbolicEnv",
    description="GSM-Symbolic: fresh grade-school word problems by seed (offline)",
)

register(
    "textarena/frozenlake",
    "environments.textarena_games:frozenlake",
    description="TextArena FrozenLake 3x3 with 2 holes, at most 5 turns (OPCD paper setting)",
)
register(
    "textarena/sokoban",
    "environments.textarena_games:sokoban",
    description="TextArena Sokoban 6x6 with 1 box, at most 5 turns (OPCD paper setting)",
)

_TWX = "environments.twx"
for _game in _TWX_DESCRIPTIONS:  # the modules import no game library until an environment is made
    register(f"twx/{_game}", f"{_TWX}:TwxEnv", description=_TWX_DESCRIPTIONS[_game], game=_game)

for _task, _what in _SCIENCEWORLD_TASKS.items():
    register(
        f"scienceworld/{_task}",
        "environments.science_world:ScienceWorldEnv",
        description=f"ScienceWorld: {_what} (variations as tasks)",
        task=_task,
    )

_MATH = "environments.math.sources"
register(
    "math/gsm8k",
    f"{_MATH}:gsm8k",
    description="GSM8K word problems (Hugging Face `datasets`, or a local JSONL/Parquet via path=)",
)
register(
    "math/math",
    f"{_MATH}:competition_math",
    description="MATH competition problems (Hugging Face `datasets`, or a local file via path=)",
)
register("math/dapo", f"{_MATH}:dapo", description="DAPO-Math-17k (Hugging Face `datasets`, or a local file via path=)")
register("math/champ", f"{_MATH}:champ", description="CHAMP competition math problems (offline)")

_QA = "environments.qa.sources"
register(
    "qa/medmcqa",
    f"{_QA}:medmcqa",
    description="MedMCQA multiple choice, A-D (the OPCD paper's export via `datasets`, or a local file via path=)",
)
register(
    "qa/safety",
    f"{_QA}:safety",
    description="The OPCD paper's safety yes/no set (its export via `datasets`, or a local file via path=)",
)

register(
    "alfworld/text",
    "environments.alfworld.env:AlfworldEnv",
    description="ALFWorld household tasks (official data via ALFWORLD_DATA, else generated offline)",
)
