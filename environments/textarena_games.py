"""The OPCD paper's TextArena games: `textarena/frozenlake` (3x3, 2 holes) and `textarena/sokoban` (6x6, 1 box).

The games' dynamics, board generation and rendering are TextArena's own (`FrozenLakeEnv`,
`SokobanEnv`); this adapter sets them up as the paper does: at most 5 turns, the rule and symbol
descriptions (TextArena's "prompt" observation) removed, the move taken from the *last* bracketed
direction in the response (``[up] [down] [left] [right]`` or ``[w] [a] [s] [d]``), and reward 1 only
on success (TextArena's partial-progress rewards are not used). A response without a bracketed move
is passed through unchanged, so the player gets TextArena's own "invalid move" feedback.

Every task is checked solvable before it is offered, by a breadth-first search over the game's
states, which also gives `expert_actions()`: FrozenLake start and goal must be connected; a Sokoban
room must be solvable within the turn budget (TextArena's generator makes rooms that can need more
pushes than 5 turns allow, so a task's seed is advanced until one fits: "train-i" tries seeds
100*i, 100*i+1, ...; eval seeds start at 100*(1_000_000 + i), validation ("validation-i") seeds at
100*(2_000_000 + i)). The splits never share a seed; a 3x3 FrozenLake with 2 holes has only a few dozen
boards, though, so its folds (eval's as much as validation's) repeat boards of the others, where Sokoban's
rooms do not.

TextArena's FrozenLake draws holes from Python's global `random`; we seed it for generation and put
the caller's random state back afterwards.
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from environments.base import SPLITS, EnvError, EnvSpec
from environments.episodic import EpisodicEnv, IndexedTasks, parse_indexed_task

EVAL_OFFSET = 1_000_000
VALIDATION_OFFSET = 2_000_000
OFFSETS = {"train": 0, "eval": EVAL_OFFSET, "validation": VALIDATION_OFFSET}
SEEDS_PER_TASK = 100
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_ALIASES = {"w": "up", "a": "left", "s": "down", "d": "right"}
_MOVE = re.compile(r"\[\s*(up|down|left|right|w|a|s|d)\s*\]", re.IGNORECASE)
ACTIONS = [f"[{m}]" for m in MOVES]
GOALS = {
    "frozenlake": "Walk from the top-left corner to the goal G at the bottom-right without stepping into a hole H.",
    "sokoban": "Push the box X onto the target O.",
}


def parse_move(response: str) -> str | None:
    """The last bracketed move of a response ("up", "down", "left", "right"), or None."""
    found = _MOVE.findall(response)
    return _ALIASES.get(found[-1].lower(), found[-1].lower()) if found else None


@contextmanager
def _seeded_global_random(seed: int) -> Iterator[None]:
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


def _bfs(start: Any, goal_test, neighbours) -> list[str] | None:
    """Shortest move sequence from `start` to a state passing `goal_test`, or None."""
    queue, seen = deque([(start, [])]), {start}
    while queue:
        state, path = queue.popleft()
        if goal_test(state):
            return path
        for move, nxt in neighbours(state):
            if nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, path + [move]))
    return None


def frozenlake_solution(grid: list[list[str]], start: tuple[int, int]) -> list[str] | None:
    """Shortest safe path on a FrozenLake grid ('H' holes, 'G' goal), as moves."""
    size = len(grid)

    def neighbours(pos):
        for move, (dr, dc) in MOVES.items():
            r, c = pos[0] + dr, pos[1] + dc
            if 0 <= r < size and 0 <= c < size and grid[r][c] != "H":
                yield move, (r, c)

    return _bfs(start, lambda p: grid[p[0]][p[1]] == "G", neighbours)


def sokoban_solution(fixed: Any, state: Any) -> list[str] | None:
    """Shortest solution of a Sokoban room (TextArena encoding: 0 wall, 2 target, 3/4 box, 5 player)."""
    import numpy as np

    walls = {tuple(p) for p in np.argwhere(fixed == 0)}
    targets = frozenset(tuple(p) for p in np.argwhere(fixed == 2))
    boxes = frozenset(tuple(p) for p in np.argwhere((state == 3) | (state == 4)))
    player = tuple(np.argwhere(state == 5)[0])
    rows, cols = fixed.shape

    def free(p):
        return 0 <= p[0] < rows and 0 <= p[1] < cols and p not in walls

    def neighbours(s):
        pos, bxs = s
        for move, (dr, dc) in MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if not free(nxt):
                continue
            if nxt in bxs:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if not free(beyond) or beyond in bxs:
                    continue
                yield move, (nxt, (bxs - {nxt}) | {beyond})
            else:
                yield move, (nxt, bxs)

    return _bfs((player, boxes), lambda s: s[1] <= targets, neighbours)


class ArenaEnv(EpisodicEnv):
    """FrozenLake or Sokoban from TextArena with the paper's settings (see the module docstring)."""

    splits = SPLITS

    def __init__(
        self,
        game: str,
        *,
        max_steps: int | None = None,
        n_train: int = 10_000,
        n_eval: int = 500,
        n_validation: int = 500,
        **game_kwargs: Any,
    ) -> None:
        counts = {"train": n_train, "validation": n_validation, "eval": n_eval}
        for split, count in counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= EVAL_OFFSET:
                raise ValueError(
                    f"textarena/{game}: n_{split} must be an integer from 1 to {EVAL_OFFSET:,} (a split's seeds end "
                    f"where the next split's begin), got {count!r}"
                )
        descriptions = {
            "frozenlake": "TextArena FrozenLake 3x3, 2 holes (OPCD paper setting)",
            "sokoban": "TextArena Sokoban 6x6, 1 box (OPCD paper setting)",
        }
        spec = EnvSpec(
            id=f"textarena/{game}",
            version="1",
            max_steps=5,
            family="arena",
            description=descriptions[game],
            kwargs=dict(game_kwargs),
        )
        super().__init__(spec, max_steps=max_steps)
        self.game, self.game_kwargs = game, game_kwargs
        self._counts = counts
        self._env: Any = None
        self._solution: list[str] = []

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, self._counts[split])

    def _base_seed(self, task_id: str) -> int:
        for split, offset in OFFSETS.items():
            index = parse_indexed_task(task_id, split)
            if index is not None:
                return (offset + index) * SEEDS_PER_TASK
        raise ValueError(f"not an arena task id: {task_id!r}")

    def _new_game(self, seed: int) -> tuple[Any, list[str] | None]:
        if self.game == "frozenlake":
            from textarena.envs.FrozenLake.env import FrozenLakeEnv

            env = FrozenLakeEnv(size=self.game_kwargs["size"], num_holes=self.game_kwargs["num_holes"])
            with _seeded_global_random(seed):
                env.reset(num_players=1, seed=seed)
            state = env.state.game_state
            return env, frozenlake_solution(state["grid"], tuple(state["player_pos"]))
        from textarena.envs.Sokoban.env import SokobanEnv

        # TextArena's own turn limit is set beyond ours: truncation is ours (spec.max_steps)
        env = SokobanEnv(
            dim_room=tuple(self.game_kwargs["dim_room"]), max_turns=1000, num_boxes=self.game_kwargs["num_boxes"]
        )
        with _seeded_global_random(seed):
            env.reset(num_players=1, seed=seed)
        return env, sokoban_solution(env.room_fixed, env.room_state)

    def _observation(self) -> str:
        import textarena as ta

        _, messages = self._env.get_observation()
        keep = [
            text
            for sender, text, kind in messages
            if kind not in (ta.ObservationType.PROMPT, ta.ObservationType.PLAYER_ACTION)
        ]
        return "\n\n".join(text.strip() for text in keep)

    def _won(self) -> bool:
        if self.game == "frozenlake":
            state = self._env.state.game_state
            return tuple(state["player_pos"]) == tuple(state["goal_pos"])
        return int((self._env.room_state == 3).sum()) == self._env.num_boxes

    def _info(self, won: bool) -> dict[str, Any]:
        return {"admissible_actions": list(ACTIONS), "won": won, "score": float(won), "goal": GOALS[self.game]}

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        base = self._base_seed(task_id)
        for seed in range(base, base + SEEDS_PER_TASK):
            env, solution = self._new_game(seed)
            if solution is not None and len(solution) <= self.spec.max_steps:
                break
        else:
            raise EnvError(f"{self.spec.id}: no solvable game among seeds {base}..{base + SEEDS_PER_TASK - 1}")
        self._env, self._solution = env, solution
        return self._observation(), self._info(False)

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        move = parse_move(action)
        done, _ = self._env.step(f"[{move}]" if move else action)
        observation = self._observation()
        reason = self._env.state.game_info[0].get("reason") if done else None
        if reason:
            observation = f"{observation}\n\n{reason}".strip()
        won = self._won()
        return observation, float(won), bool(done or won), self._info(won)

    def expert_actions(self) -> list[str]:
        """A shortest winning move sequence from the start of the current episode."""
        if self._env is None:
            raise RuntimeError(f"{self.spec.id}: call reset() before expert_actions()")
        return [f"[{move}]" for move in self._solution]

    def close(self) -> None:
        self._env = None
        self._active = False


def frozenlake(
    *,
    size: int = 3,
    num_holes: int = 2,
    max_steps: int | None = None,
    cache_dir: str | None = None,
    n_train: int = 10_000,
    n_eval: int = 500,
    n_validation: int = 500,
) -> ArenaEnv:
    """FrozenLake: fixed start top-left, goal bottom-right, `num_holes` holes, solvability checked.

    `cache_dir` is accepted for uniformity with the other built-ins; these games are generated in
    microseconds and never written to disk.
    """
    return ArenaEnv(
        "frozenlake",
        size=size,
        num_holes=num_holes,
        max_steps=max_steps,
        n_train=n_train,
        n_eval=n_eval,
        n_validation=n_validation,
    )


def sokoban(
    *,
    dim_room: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    max_steps: int | None = None,
    cache_dir: str | None = None,
    n_train: int = 10_000,
    n_eval: int = 500,
    n_validation: int = 500,
) -> ArenaEnv:
    """Sokoban: push the box(es) onto the target(s); only rooms solvable within max_steps are offered.

    `cache_dir` is accepted for uniformity with the other built-ins (nothing is cached).
    """
    return ArenaEnv(
        "sokoban",
        dim_room=tuple(dim_room),
        num_boxes=num_boxes,
        max_steps=max_steps,
        n_train=n_train,
        n_eval=n_eval,
        n_validation=n_validation,
    )
