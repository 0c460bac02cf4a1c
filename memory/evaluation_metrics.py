"""What the fields of an evaluation row that readers index with may hold: checked on import, and by the readers.

What: `evaluation_problem(num_episodes, metrics, phases) -> str | None` says what is wrong with an evaluation row
("metrics.continual.after_phase must be a phase of the run's curriculum (an integer from 0 to 3), got 2000000"), or
None; `curriculum_phases(config)` is the number of phases of a stored run config's curriculum (None without one).
`memory import` (`memory.transfer`) refuses a row with a problem, naming its line, id and field; the continual matrix
(`agent_runtime.evaluation.matrix.load_matrix`, `agent-runtime report`) and the dashboard's learning page answer
one already in a store with a `StoredRowError` naming the row, not a traceback.

Why: the readers index with these fields. `metrics.continual.after_phase` is a row of the continual matrix (a row
number of 2,000,000 made the dashboard draw two million rows; "x" failed `int()`), `metrics.episodes` are the games
paired by seed and counted by `won`, `num_episodes` divides a success count. Everything else in `metrics` is shown,
never indexed, and varies by writer (the gate, consolidation, assessments): it is left as it is.

The rules: `num_episodes` a count up to `MAX_EPISODES`; `metrics.continual` (an assessment's mark) an object whose
`after_phase` is an integer from 0 (before any phase) to the run's number of phases, on a run with a curriculum, and
whose `label` is a string of at most `MAX_LABEL_CHARS`; `metrics.episodes` a list of at most `MAX_EPISODES` objects,
each with `won` true or false, `seed` an integer or null, `task_id` a string or an integer; `metrics.interval` a pair
[lower, upper] of rates.
"""

from __future__ import annotations

from typing import Any

MAX_EPISODES = 1_000_000  # games in one evaluation row; far above any evaluation this agent-runtime plays
MAX_LABEL_CHARS = 200


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def curriculum_phases(config: Any) -> int | None:
    """The number of phases of a stored run config's curriculum, or None when it has none."""
    curriculum = config.get("curriculum") if isinstance(config, dict) else None
    phases = curriculum.get("phases") if isinstance(curriculum, dict) else None
    return len(phases) if isinstance(phases, list) else None


def _continual_problem(mark: Any, phases: int | None) -> str | None:
    if not isinstance(mark, dict):
        return f"metrics.continual must be an object with after_phase and label, got {_show(mark)}"
    after = mark.get("after_phase")
    if phases is None:
        return "metrics.continual marks a curriculum assessment, but the run has no curriculum"
    if not _is_int(after) or not 0 <= after <= phases:
        return (
            f"metrics.continual.after_phase must be a phase of the run's curriculum (an integer from 0 to {phases}), "
            f"got {_show(after)}"
        )
    label = mark.get("label")
    if label is not None and not (isinstance(label, str) and len(label) <= MAX_LABEL_CHARS):
        return f"metrics.continual.label must be a string of at most {MAX_LABEL_CHARS} characters, got {_show(label)}"
    return None


def _episodes_problem(episodes: Any) -> str | None:
    if not isinstance(episodes, list) or len(episodes) > MAX_EPISODES:
        return f"metrics.episodes must be a list of at most {MAX_EPISODES} games, got {_show(episodes)}"
    for i, game in enumerate(episodes):
        where = f"metrics.episodes[{i}]"
        if not isinstance(game, dict):
            return f"{where} must be an object with won, seed and task_id, got {_show(game)}"
        if not isinstance(game.get("won"), bool):
            return f"{where}.won must be true or false, got {_show(game.get('won'))}"
        seed = game.get("seed")
        if seed is not None and not (_is_int(seed) and abs(seed) < 2**63):
            return f"{where}.seed must be an integer or null, got {_show(seed)}"
        task = game.get("task_id")
        if not (isinstance(task, str) or _is_int(task)):
            return f"{where}.task_id must be a string or an integer, got {_show(task)}"
    return None


def _rate(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and 0 <= value <= 1


def evaluation_problem(num_episodes: Any, metrics: Any, phases: int | None) -> str | None:
    """What is wrong with an evaluation row's indexed fields (see the module docstring), or None. `phases`: the
    number of phases of its run's curriculum (None: no curriculum)."""
    if not _is_int(num_episodes) or not 0 <= num_episodes <= MAX_EPISODES:
        return f"num_episodes must be a count from 0 to {MAX_EPISODES}, got {_show(num_episodes)}"
    if not isinstance(metrics, dict):
        return f"metrics must be an object, got {_show(metrics)}"
    if "continual" in metrics and (problem := _continual_problem(metrics["continual"], phases)):
        return problem
    if "episodes" in metrics and (problem := _episodes_problem(metrics["episodes"])):
        return problem
    interval = metrics.get("interval")
    if "interval" in metrics and not (
        isinstance(interval, list) and len(interval) == 2 and all(_rate(x) for x in interval)
    ):
        return f"metrics.interval must be a pair [lower, upper] of rates from 0 to 1, got {_show(interval)}"
    return None
