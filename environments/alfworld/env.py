"""`alfworld/text`: ALFWorld's text household tasks, on the official games or on offline-generated ones.

Official games: point `data_path` (or the `ALFWORLD_DATA` environment variable, as alfworld's own scripts do; it counts
only when it holds json_2.1.1) at the downloaded data; tasks are the solvable `game.tw-pddl` files under
`json_2.1.1/train` (train), `json_2.1.1/valid_unseen` (eval; `eval_split="valid_seen"` for the seen-rooms split) and
the other of the two valid folds (validation: `valid_seen` by default), filtered by task type exactly as alfworld's
`AlfredTWEnv` filters them.

Generated games (no data): `environments.alfworld.generate` builds ALFWorld-style games from the wheel's own files;
train tasks use ALFRED's training floor plans and eval tasks its held-out floor plans (so eval rooms are unseen);
validation tasks ("validation-<i>") are games of their own seeds on the training floor plans, as the official
valid_seen fold is, so that decisions never look at eval's rooms. Every
generated game is played by alfworld's hand-coded expert before it is offered; a game the expert does not win within
`spec.max_steps` is discarded and the task moves to the next attempt seed (so every offered game is winnable within the
step budget). The winning expert trajectory is cached with the game and served by `expert_actions()`. Generated games
live in `<cache_dir>/alfworld/<hash>/`, written through `environments.game_cache` (shared by every workdir, built in a
temporary folder renamed into place, an entry that does not match its manifest rebuilt). Scores on generated games are
not comparable with published ALFWorld numbers (different rooms' object layouts, our own object placement);
`spec.kwargs["source"]` and `info["source"]` say which kind you have.

Observations, admissible actions and the win condition are alfworld's (TextWorld's PDDL backend with
alfworld's name demangler); reward is 1 on the winning step, 0 otherwise. The PDDL engine applies only
admissible commands (anything else is "Nothing happens.") and writes no files; interpreter
meta-commands (`save`, `restore`, ...; `environments.interpreter.meta_command`) get the same answer
without reaching it, flagged in `info["meta_command"]` as TextWorld flags them; so do lines naming several objects
or commands (`multi_command`: "take all.", "take X and Y", "take X. take Y"), flagged in `info["multi_command"]`,
unless the line is itself an admissible command.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from environments.base import SPLITS, EnvError, EnvSpec
from environments.episodic import EpisodicEnv, IndexedTasks, parse_indexed_task, resolve_cache_dir
from environments.game_cache import cached_entry
from environments.interpreter import meta_command, multi_command

_GENERATOR_VERSION = "1"
_GAME_FILES = ("game.tw-pddl", "traj_data.json", "expert.json")  # a complete cache entry
MAX_ATTEMPTS = 40
NOTHING_HAPPENS = "Nothing happens."  # the PDDL engine's answer to a command it cannot apply


class AlfworldDataError(EnvError, FileNotFoundError):
    """The official data path does not hold ALFWorld games."""


def _official_games(root: Path, split: str, task_types: Sequence[str]) -> list[str]:
    """Solvable official games of a split, as alfworld's AlfredTWEnv.collect_game_files selects them."""
    base = root / "json_2.1.1" / split
    if not base.is_dir():
        raise AlfworldDataError(
            f"no ALFWorld split at {base}; ALFWORLD_DATA / data_path must point at the "
            "folder that holds json_2.1.1 (see `alfworld-download`)"
        )
    games = []
    for traj in sorted(base.rglob("traj_data.json")):
        folder = traj.parent
        game = folder / "game.tw-pddl"
        if "movable" in str(folder) or "Sliced" in str(folder) or not game.exists():
            continue
        if json.loads(traj.read_text()).get("task_type") not in task_types:
            continue
        if json.loads(game.read_text()).get("solvable"):
            games.append(str(folder.relative_to(root)))
    return games


def _default_data_path() -> str | None:
    """$ALFWORLD_DATA when it holds the official games (importing alfworld sets the variable to its
    default cache folder whether or not anything was downloaded there)."""
    data = os.environ.get("ALFWORLD_DATA")
    return data if data and (Path(data).expanduser() / "json_2.1.1").is_dir() else None


class AlfworldEnv(EpisodicEnv):
    """ALFWorld text games (official when data is given, generated otherwise)."""

    splits = SPLITS

    def __init__(
        self,
        *,
        task_types: Sequence[str] | None = None,
        data_path: str | None = None,
        eval_split: str = "valid_unseen",
        max_steps: int | None = None,
        cache_dir: str | None = None,
        n_train: int = 1000,
        n_eval: int = 100,
        n_validation: int = 100,
    ) -> None:
        from environments.alfworld.generate import TASK_TYPES

        types = tuple(task_types) if task_types is not None else TASK_TYPES
        unknown = [t for t in types if t not in TASK_TYPES]
        if unknown or not types:
            raise ValueError(f"unknown ALFWorld task types {unknown}; known: {', '.join(TASK_TYPES)}")
        if eval_split not in ("valid_unseen", "valid_seen"):
            raise ValueError(f"eval_split must be 'valid_unseen' or 'valid_seen', got {eval_split!r}")
        data = data_path or _default_data_path()
        self.source = "official" if data else "generated"
        description = (
            "ALFWorld text games (official data)"
            if data
            else "ALFWorld-style text games generated offline (not comparable with published ALFWorld scores)"
        )
        spec = EnvSpec(
            id="alfworld/text",
            version="1",
            max_steps=50,
            family="text",
            description=description,
            kwargs={"source": self.source, "task_types": list(types)},
        )
        super().__init__(spec, max_steps=max_steps)
        self.task_types = types
        self.cache_dir = resolve_cache_dir(cache_dir) / "alfworld"
        if data:
            self.data_root = Path(data).expanduser()
            validation_split = "valid_seen" if eval_split == "valid_unseen" else "valid_unseen"
            self._official = {
                "train": _official_games(self.data_root, "train", types),
                "validation": _official_games(self.data_root, validation_split, types),
                "eval": _official_games(self.data_root, eval_split, types),
            }
            for split, games in self._official.items():
                if not games:
                    raise AlfworldDataError(f"no solvable {split} games of types {list(types)} under {self.data_root}")
        else:
            self._counts = {"train": n_train, "validation": n_validation, "eval": n_eval}
        self._env: Any = None
        self._loaded: Path | None = None
        self._walkthrough: list[str] = []
        self._state: Any = None
        self._goal = ""

    def _tasks(self, split: str) -> Sequence[str]:
        if self.source == "official":
            return self._official[split]
        return IndexedTasks(split, self._counts[split])

    def _valid_task(self, task_id: str) -> bool:
        if self.source == "official":
            return any(task_id in games for games in self._official.values())
        return super()._valid_task(task_id)

    # -- generated games ------------------------------------------------------------------------
    def _task_key(self, task_id: str) -> tuple[str, int, str]:
        split = next(split for split in self.splits if parse_indexed_task(task_id, split) is not None)
        index = parse_indexed_task(task_id, split)
        assert index is not None, task_id
        return split, index, self.task_types[index % len(self.task_types)]

    def game_dir(self, task_id: str) -> Path:
        """The folder holding the (validated) game of a generated task, generating it on first use."""
        import alfworld

        split, index, task_type = self._task_key(task_id)
        inputs = {
            "split": split,
            "index": index,
            "type": task_type,
            "gen": _GENERATOR_VERSION,
            "alfworld": getattr(alfworld, "__version__", "?"),
            "expert": self.spec.max_steps,
        }
        key = hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:24]
        return cached_entry(
            self.cache_dir, key, _GAME_FILES, lambda tmp: self._generate(split, index, task_type, tmp), inputs=inputs
        )

    def _generate(self, split: str, index: int, task_type: str, folder: Path) -> None:
        """Write into `folder` the first game of the task that the expert wins, and the expert's actions."""
        from alfworld.gen import constants

        from environments.alfworld.generate import available_scenes, generate_game

        wanted = set(constants.TEST_SCENE_NUMBERS if split == "eval" else constants.TRAIN_SCENE_NUMBERS)
        scenes = [s for s in available_scenes() if s in wanted]
        for attempt in range(MAX_ATTEMPTS):
            rng = random.Random(f"{split}/{index}/{task_type}/{attempt}")
            game = generate_game(rng.randrange(2**31), task_type, rng.choice(scenes))
            if game is None:
                continue
            actions = self._expert_solution(game.write(folder))  # a later attempt overwrites both files
            if actions is not None:
                (folder / "expert.json").write_text(
                    json.dumps({"actions": actions, "attempt": attempt, "task": game.task_description})
                )
                return
        raise EnvError(f"alfworld/text: no {task_type} game the expert could solve after {MAX_ATTEMPTS} attempts")

    def _expert_solution(self, game_file: Path) -> list[str] | None:
        """Play alfworld's hand-coded expert on a game; its actions if it wins, else None."""
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos

        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=True, extras=["gamefile", "expert_plan"])
        env = textworld.start(
            str(game_file),
            request_infos=infos,
            wrappers=[AlfredDemangler, AlfredInfos, lambda e: AlfredExpert(e, "handcoded")],
        )
        state = random.getstate()
        random.seed(0)  # the expert picks random admissible actions when stuck
        try:
            game_state, actions = env.reset(), []
            for _ in range(self.spec.max_steps):
                action = game_state["extra.expert_plan"][0]
                actions.append(action)
                game_state, _, _ = env.step(action)
                if game_state["won"]:
                    return actions
            return None
        except Exception:  # noqa: BLE001 - the expert raises on games it cannot handle: such a game is not offered
            return None
        finally:
            random.setstate(state)
            env.close()

    # -- playing --------------------------------------------------------------------------------
    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        if self.source == "official":
            folder, self._walkthrough = self.data_root / task_id, []
        else:
            folder = self.game_dir(task_id)
            self._walkthrough = json.loads((folder / "expert.json").read_text())["actions"]
        if self._env is None or self._loaded != folder:  # loading parses the PDDL: reuse it for replays
            self.close()
            infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
            self._env = textworld.start(
                str(folder / "game.tw-pddl"), request_infos=infos, wrappers=[AlfredDemangler, AlfredInfos]
            )
            self._loaded = folder
        state = self._state = self._env.reset()
        feedback = state["feedback"]
        self._goal = feedback.split("Your task is to: ", 1)[-1].strip() if "Your task is to: " in feedback else ""
        return feedback.strip(), self._info(state)

    def _info(self, state: Any) -> dict[str, Any]:
        won = bool(state["won"])
        return {
            "admissible_actions": list(state["admissible_commands"] or []),
            "won": won,
            "score": float(won),
            "goal": self._goal,
            "source": self.source,
        }

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        meta = meta_command(action)
        if meta is not None:  # the PDDL engine would not apply it either; flagged as TextWorld flags it
            return NOTHING_HAPPENS, 0.0, False, {**self._info(self._state), "meta_command": meta}
        multi = multi_command(action)  # several objects or commands in one line: never sent, as in TextWorld
        if multi is not None and action.strip().lower() not in {
            a.lower() for a in self._state["admissible_commands"] or []
        }:
            return NOTHING_HAPPENS, 0.0, False, {**self._info(self._state), "multi_command": multi}
        state, _, done = self._env.step(action.strip())
        self._state = state
        feedback = state["feedback"].strip() or NOTHING_HAPPENS
        won = bool(state["won"])
        return feedback, float(won), bool(done or won), self._info(state)

    def expert_actions(self) -> list[str]:
        """A winning action sequence from the start of the current episode: the validated hand-coded expert's
        trajectory for generated games, the PDDL planner's plan for official ones."""
        if self._env is None or self._task_id is None:
            raise RuntimeError("alfworld/text: call reset() before expert_actions()")
        if self.source == "generated":
            return list(self._walkthrough)
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

        infos = textworld.EnvInfos(extras=["walkthrough"])
        planner = textworld.start(
            str(self.data_root / self._task_id / "game.tw-pddl"), request_infos=infos, wrappers=[AlfredDemangler]
        )
        try:
            return list(planner.reset()["extra.walkthrough"])
        finally:
            planner.close()

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env, self._loaded = None, None
        self._active = False
