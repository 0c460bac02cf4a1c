"""TextWorld games: coin_collector, treasure_hunter, cooking, simple and custom, generated on demand.

Each task is one game: its seed plus the environment's parameters (level, recipe size, ...) decide
the game completely, so generation is deterministic and the compiled game is cached on disk as
``<cache_dir>/textworld/<hash>/game.z8`` (and its ``game.json``), the hash covering the challenge, its
settings, the seed, the split, TextWorld's version and `_GENERATOR_VERSION`; a second reset of the same
task (in any process, from any workdir sharing the cache) only loads the file. Games are generated through
TextWorld's Python API (`textworld.challenges` and `textworld.generator`) by `environments.game_cache`:
into a temporary folder renamed into place, under a per-game lock, so concurrent workers never read
half-written games, and an entry is played only if its manifest says it is this task's game (a damaged,
planted or older version's entry is rebuilt). A flat ``<hash>.z8`` + ``<hash>.json`` pair written by earlier
versions (an old workdir's ``games/``) is still read when both are plain files of this user's, no symlink.

Splits: train task "train-i" is game seed i, eval task "eval-i" is game seed 1_000_000 + i and validation
task "validation-i" game seed 2_000_000 + i, so the splits never share a seed (`n_train`, `n_eval` and
`n_validation`, at most 1,000,000 each, size them). The cooking and simple challenges also have held-out
ingredients: eval tasks use them (cooking's "test" recipe split, simple's test foods), and validation tasks
cooking's "valid" recipe split, which TextWorld keeps apart from both, and simple's test foods (simple has
only two sets of foods, so validation draws from eval's, in games of its own seeds).

Rewards are differences of the game's cumulative score; `info` carries admissible_actions, won,
score, max_score and goal. `expert_actions()` returns the game's walkthrough (for tests and oracle
baselines).

The interpreter runs in a child process with a private working directory (`environments.interpreter`),
and only game commands reach it: an interpreter meta-command (`save`, `restore`, `restart`, `undo`,
`script`, `verbose`, `score`, TextWorld's `print_state`, ...) is answered as an unknown verb
(`UNKNOWN_VERB`), with reward 0, the state unchanged and `info["meta_command"]` naming the word; it
still uses one step of the budget, like any other invalid action. A line the parser would read as several
objects or several commands (`multi_command`: "take all.", "get everything from fridge", "take X and Y",
"take X. take Y", ...) is refused the same way (`ONE_AT_A_TIME`, `info["multi_command"]` naming the word or
mark) unless it is exactly one of the admissible actions: otherwise "take all." takes every ingredient in one
step and scores.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from environments.base import SPLITS, EnvSpec
from environments.episodic import EpisodicEnv, IndexedTasks, parse_indexed_task, resolve_cache_dir
from environments.game_cache import cache_key, cached_entry, trusted_files
from environments.interpreter import (
    ONE_AT_A_TIME,
    UNKNOWN_VERB,
    InterpreterProcess,
    meta_command,
    multi_command,
    safe_command,
)

__all__ = [
    "TextWorldEnv",
    "coin_collector",
    "cooking",
    "custom",
    "game_seed",
    "safe_command",
    "simple",
    "treasure_hunter",
]

EVAL_SEED_OFFSET = 1_000_000
VALIDATION_SEED_OFFSET = 2_000_000
SEED_OFFSETS = {"train": 0, "eval": EVAL_SEED_OFFSET, "validation": VALIDATION_SEED_OFFSET}
_GENERATOR_VERSION = "1"  # bump when generation changes so old cache entries are not reused
_GAME_FILES = ("game.z8", "game.json")  # what every cache entry holds (beside what else TextWorld writes)


_NOISE = ("Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?",)


def _clean(text: str) -> str:
    """Drop TextWorld's ASCII-art banner, the prompt/status line and the restart question; collapse blank lines."""
    lines = text.splitlines()
    art = [i for i, line in enumerate(lines) if "$$" in line]
    if art:
        lines = lines[art[-1] + 1 :]
    lines = [line for line in lines if not line.startswith(">") and line.strip() not in _NOISE]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(line.rstrip() for line in lines)).strip()


def game_seed(task_id: str) -> int:
    """The generation seed of a TextWorld task id."""
    split = _split_of(task_id)
    return SEED_OFFSETS[split] + parse_indexed_task(task_id, split)


def _split_of(task_id: str) -> str:
    """The split of a TextWorld task id ("train-3" -> "train")."""
    for split in SEED_OFFSETS:
        if parse_indexed_task(task_id, split) is not None:
            return split
    raise ValueError(f"not a TextWorld task id: {task_id!r}; ids look like 'train-0', 'validation-0' or 'eval-0'")


class TextWorldEnv(EpisodicEnv):
    """A TextWorld challenge (or a custom generated game) as a TextEnv.

    `challenge` is one of TextWorld's challenges ("tw-coin_collector", "tw-treasure_hunter",
    "tw-cooking", "tw-simple") with its `settings`, or "custom" with `settings` holding nb_rooms,
    nb_objects, quest_length and quest_breadth.
    """

    splits = SPLITS

    def __init__(
        self,
        env_id: str,
        challenge: str,
        settings: dict[str, Any],
        *,
        description: str = "",
        max_steps: int | None = None,
        default_max_steps: int = 50,
        cache_dir: str | Path | None = None,
        n_train: int = 1000,
        n_eval: int = 100,
        n_validation: int = 100,
    ) -> None:
        counts = {"train": n_train, "validation": n_validation, "eval": n_eval}
        for split, count in counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= EVAL_SEED_OFFSET:
                raise ValueError(
                    f"{env_id}: n_{split} must be an integer from 1 to {EVAL_SEED_OFFSET:,} (a split's seeds end where "
                    f"the next split's begin), got {count!r}"
                )
        spec = EnvSpec(
            id=env_id,
            version="1",
            max_steps=default_max_steps,
            family="text",
            description=description,
            kwargs={"challenge": challenge, **settings},
        )
        super().__init__(spec, max_steps=max_steps)
        self.challenge, self.settings = challenge, dict(settings)
        self.cache_dir = resolve_cache_dir(cache_dir) / "textworld"
        self._counts = counts
        self._game: InterpreterProcess | None = None
        self._loaded_path: Path | None = None
        self._state: Any = None
        self._walkthrough: list[str] = []

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, self._counts[split])

    # -- generation and cache -----------------------------------------------------------------
    def game_key(self, task_id: str) -> str:
        """Hash of everything that determines the game of `task_id` (its cache entry's name)."""
        return cache_key(self._game_inputs(task_id))

    def _game_inputs(self, task_id: str) -> dict[str, Any]:
        import textworld

        return {
            "challenge": self.challenge,
            "settings": self.settings,
            "seed": game_seed(task_id),
            "split": _split_of(task_id),
            "textworld": textworld.__version__,
            "gen": _GENERATOR_VERSION,
        }

    def game_file(self, task_id: str) -> Path:
        """The compiled game of `task_id`, generated and cached on first use."""
        inputs = self._game_inputs(task_id)
        key = cache_key(inputs)
        if trusted_files(self.cache_dir, (f"{key}.z8", f"{key}.json")):
            return self.cache_dir / f"{key}.z8"  # the flat layout of earlier versions (an old workdir's games/)
        entry = cached_entry(self.cache_dir, key, _GAME_FILES, lambda tmp: self._generate(task_id, tmp), inputs=inputs)
        return entry / "game.z8"

    def _generate(self, task_id: str, folder: Path) -> None:
        """Compile the game of `task_id` into `folder` (game.z8 and game.json)."""
        from textworld.generator import compile_game
        from textworld.generator.game import GameOptions

        options = GameOptions()
        options.seeds = game_seed(task_id)
        options.force_recompile = True
        if self.challenge == "custom":
            from textworld.generator import make_game

            options.nb_rooms = self.settings["nb_rooms"]
            options.nb_objects = self.settings["nb_objects"]
            options.quest_length = self.settings["quest_length"]
            options.quest_breadth = self.settings["quest_breadth"]
            game = make_game(options)
        else:
            from textworld.challenges import CHALLENGES

            settings = dict(self.settings)
            split = _split_of(task_id)
            if self.challenge == "tw-cooking":
                settings["split"] = {"train": "train", "validation": "valid", "eval": "test"}[split]
            if self.challenge == "tw-simple":  # test=True draws the food from held-out names
                settings["test"] = split != "train"
            game = CHALLENGES[self.challenge][1](settings, options)
        options.path = str(folder / "game.z8")
        compile_game(game, options)

    # -- playing --------------------------------------------------------------------------------
    def _load(self, path: Path) -> None:
        if self._game is not None and self._game.alive and self._loaded_path == path:
            return
        if self._game is None:
            self._game = InterpreterProcess()
        self._loaded_path = None
        self._game.load(
            path,
            {
                "admissible_commands": True,
                "won": True,
                "lost": True,
                "score": True,
                "max_score": True,
                "objective": True,
                "policy_commands": True,
                "extras": ["walkthrough"],
            },
        )
        self._loaded_path = path

    @property
    def interpreter(self) -> InterpreterProcess | None:
        """The interpreter process of the loaded game (None before the first reset and after close)."""
        return self._game

    def _info(self, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "admissible_actions": sorted(state["admissible_commands"] or []),
            "won": bool(state["won"]),
            "score": state["score"],
            "max_score": state["max_score"],
            "goal": state["objective"] or "",
        }

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._load(self.game_file(task_id))
        state = self._game.reset()
        self._state = state
        self._walkthrough = list(state.get("extra.walkthrough") or state["policy_commands"] or [])
        return _clean(state["feedback"]), self._info(state)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        meta = meta_command(action)
        if meta is not None:  # never sent: the game's state, score and files stay as they are
            return UNKNOWN_VERB, 0.0, False, {**self._info(self._state), "meta_command": meta}
        command = safe_command(action)
        multi = multi_command(command)  # never sent either: "take all." would take every ingredient at once
        if multi is not None and command.lower() not in {a.lower() for a in self._state["admissible_commands"] or []}:
            return ONE_AT_A_TIME, 0.0, False, {**self._info(self._state), "multi_command": multi}
        previous = self._state["score"] or 0
        state, done = self._game.step(command)
        self._state = state
        reward = (state["score"] or 0) - previous
        terminated = bool(done or state["won"] or state["lost"])
        return _clean(state["feedback"]), float(reward), terminated, self._info(state)

    def expert_actions(self) -> list[str]:
        """The game's walkthrough from the start of the current episode (call after reset)."""
        if self._state is None:
            raise RuntimeError(f"{self.spec.id}: call reset() before expert_actions()")
        return list(self._walkthrough)

    def close(self) -> None:
        if self._game is not None:
            self._game.close()
        self._game, self._loaded_path = None, None
        self._state = None
        self._active = False


def coin_collector(
    *,
    level: int = 5,
    max_steps: int | None = None,
    cache_dir: str | Path | None = None,
    n_train: int = 1000,
    n_eval: int = 100,
    n_validation: int = 100,
) -> TextWorldEnv:
    """Coin Collector: walk a chain of rooms (level = quest length, +100 adds distractor rooms) to the coin."""
    return TextWorldEnv(
        "textworld/coin_collector",
        "tw-coin_collector",
        {"level": level},
        description="TextWorld Coin Collector: find and take the coin",
        max_steps=max_steps,
        default_max_steps=max(25, 5 * ((level - 1) % 100 + 1)),
        cache_dir=cache_dir,
        n_train=n_train,
        n_eval=n_eval,
        n_validation=n_validation,
    )


def treasure_hunter(
    *,
    level: int = 1,
    max_steps: int | None = None,
    cache_dir: str | Path | None = None,
    n_train: int = 1000,
    n_eval: int = 100,
    n_validation: int = 100,
) -> TextWorldEnv:
    """Treasure Hunter (levels 1-30): find the named object, with distractors, doors and keys at higher levels."""
    return TextWorldEnv(
        "textworld/treasure_hunter",
        "tw-treasure_hunter",
        {"level": level},
        description="TextWorld Treasure Hunter: find the named object among distractors",
        max_steps=max_steps,
        default_max_steps=50,
        cache_dir=cache_dir,
        n_train=n_train,
        n_eval=n_eval,
        n_validation=n_validation,
    )


def cooking(
    *,
    recipe: int = 1,
    take: int = 1,
    go: int = 1,
    open: bool = False,
    cook: bool = False,
    cut: bool = False,
    drop: bool = False,
    max_steps: int | None = None,
    cache_dir: str | Path | None = None,
    n_train: int = 1000,
    n_eval: int = 100,
    n_validation: int = 100,
) -> TextWorldEnv:
    """The First TextWorld Problems cooking game: gather ingredients, prepare the recipe, eat the meal."""
    settings = {
        "recipe": recipe,
        "take": take,
        "go": go,
        "open": open,
        "cook": cook,
        "cut": cut,
        "drop": drop,
        "recipe_seed": 0,
    }
    return TextWorldEnv(
        "textworld/cooking",
        "tw-cooking",
        settings,
        description="TextWorld cooking: read the cookbook, prepare and eat the meal",
        max_steps=max_steps,
        default_max_steps=50,
        cache_dir=cache_dir,
        n_train=n_train,
        n_eval=n_eval,
        n_validation=n_validation,
    )


def simple(
    *,
    rewards: str = "balanced",
    goal: str = "detailed",
    max_steps: int | None = None,
    cache_dir: str | Path | None = None,
    n_train: int = 1000,
    n_eval: int = 100,
    n_validation: int = 100,
) -> TextWorldEnv:
    """TextWorld's "simple" house game (fixed map, find the food and put it on the stove)."""
    if rewards not in ("dense", "balanced", "sparse") or goal not in ("detailed", "brief", "none"):
        raise ValueError(
            "rewards must be dense|balanced|sparse and goal detailed|brief|none, "
            f"got rewards={rewards!r}, goal={goal!r}"
        )
    return TextWorldEnv(
        "textworld/simple",
        "tw-simple",
        {"rewards": rewards, "goal": goal},
        description="TextWorld simple: a fixed house, fetch the food to the stove",
        max_steps=max_steps,
        default_max_steps=50,
        cache_dir=cache_dir,
        n_train=n_train,
        n_eval=n_eval,
        n_validation=n_validation,
    )


def custom(
    *,
    nb_rooms: int = 3,
    nb_objects: int = 5,
    quest_length: int = 3,
    quest_breadth: int = 1,
    max_steps: int | None = None,
    cache_dir: str | Path | None = None,
    n_train: int = 1000,
    n_eval: int = 100,
    n_validation: int = 100,
) -> TextWorldEnv:
    """A custom TextWorld game (tw-make custom): rooms, objects and a quest of the given length."""
    settings = {
        "nb_rooms": nb_rooms,
        "nb_objects": nb_objects,
        "quest_length": quest_length,
        "quest_breadth": quest_breadth,
    }
    return TextWorldEnv(
        "textworld/custom",
        "custom",
        settings,
        description="TextWorld custom: a generated world with a quest of given length",
        max_steps=max_steps,
        default_max_steps=max(30, 10 * quest_length),
        cache_dir=cache_dir,
        n_train=n_train,
        n_eval=n_eval,
        n_validation=n_validation,
    )
