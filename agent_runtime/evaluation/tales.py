"""The TALES protocol on the runtime's evaluation: the suite's TextWorld Express and ScienceWorld games, its step
limit, its metric.

TALES (the Text-Adventure Learning Environment Suite) scores an agent per game by the highest score it reached
within the step limit, divided by the game's maximum, and averages those per framework. Its leaderboard plays each
game once, on the first game of the framework's test fold, for 100 steps, the agent writing its actions freely
(no list of admissible actions). `bench/tales.py` plays the same games through `evaluate` (one held-out episode per
game, `eval-0`, which is that first test game) and prints the per-framework means beside the leaderboard's rows.

Where this differs from TALES' own harness, and is stated beside every number:
- TALES restarts a game that ended (won or lost) and plays on within the 100 steps, keeping the highest score; here
  an episode ends when the game ends. A won game scores the same; a lost one keeps the score it had reached.
- The prompt is this runtime's (its system prompt per family, the last `agent.max_history_turns` turns), not
  TALES' zero-shot agent's.
- A reply the runtime cannot read as one command (the first line, prose or several sentences) is answered "not a
  valid action" and not sent to the game; TALES sends every reply, and the game answers that it does not
  understand. Either way it scores nothing.
- `choice` mode (the model picks among the admissible actions) is this runtime's and labelled so; only `free` is
  comparable with the leaderboard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from environments.science_world import TASKS as SCIENCEWORLD_TASKS
from environments.twx import TALES_GAMES

FRAMEWORKS = ("twx", "scienceworld")
STEPS = 100  # TALES' step limit per game

# The leaderboard's rows for these two frameworks (TALES' website table, docs/website/_includes/table.md), in %
LEADERBOARD: dict[str, tuple[float, float]] = {
    "Llama-3.2-1B-Instruct": (19.0, 2.4),
    "Llama-3.2-3B-Instruct": (42.0, 10.0),
    "Qwen2.5-7B-Instruct": (45.6, 12.6),
    "Llama-3.1-8B-Instruct": (50.3, 15.7),
}


@dataclass(frozen=True)
class TalesGame:
    """One game of the suite as an environment entry of a run config."""

    name: str  # TALES' name (TWXCoinCollector, ScienceWorldBoil)
    framework: str  # "twx" or "scienceworld"
    entry: dict[str, Any] = field(hash=False)  # {"id": ..., "max_steps": ..., "kwargs": {...}}


def suite(frameworks: tuple[str, ...] = FRAMEWORKS, *, mode: str = "free", steps: int = STEPS) -> list[TalesGame]:
    """The suite's games of `frameworks`, in TALES' order, as config entries for `mode` ("free" or "choice"). A TWX
    entry names the built-in `tales/<name>` (its TWX game with TALES' parameters, `environments.twx.TALES_GAMES`)."""
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown:
        raise ValueError(f"unknown TALES framework(s) {unknown}; accepted: {', '.join(FRAMEWORKS)}")
    if mode not in ("free", "choice"):
        raise ValueError(f"mode must be 'free' (TALES' protocol) or 'choice' (ours), got {mode!r}")
    games = []
    if "twx" in frameworks:
        for name in TALES_GAMES:
            games.append(TalesGame(name, "twx", {"id": f"tales/{name}", "max_steps": steps, "kwargs": {}}))
    if "scienceworld" in frameworks:
        for task in SCIENCEWORLD_TASKS:
            # the free protocol shows no action list: listing thousands of actions would slow every step
            kwargs = {} if mode == "choice" else {"admissible_actions": False}
            entry = {"id": f"scienceworld/{task}", "max_steps": steps, "kwargs": kwargs}
            games.append(TalesGame(f"ScienceWorld{task.title().replace('-', '')}", "scienceworld", entry))
    return games


def normalized_score(steps: list[dict[str, Any]]) -> float:
    """TALES' score of one played game: the highest score reached (the start counts as 0), over the maximum."""
    best, maximum = 0.0, None
    for info in steps:
        if "score" in info:
            best = max(best, float(info["score"]))
        if info.get("max_score"):
            maximum = float(info["max_score"])
    if maximum is None:
        won = any(info.get("won") for info in steps)
        return 1.0 if won else 0.0
    return min(best / maximum, 1.0)


def framework_means(scores: dict[str, float], games: list[TalesGame]) -> dict[str, tuple[float, int]]:
    """Each framework's mean normalised score over its games that were played, and how many were."""
    means = {}
    for framework in FRAMEWORKS:
        played = [scores[g.name] for g in games if g.framework == framework and g.name in scores]
        if played:
            means[framework] = (sum(played) / len(played), len(played))
    return means
