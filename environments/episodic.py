"""Shared episode bookkeeping for the built-in environments.

Every built-in game follows the same rules, so they live here once: reset before step, a step budget
(`spec.max_steps`, overridable by the `max_steps` construction kwarg) that truncates the episode,
no stepping after the end, the task chosen by `task_id` or deterministically by `seed` (a train task), a typed
error for a task id the environment never handed out, and `MissingSplitError` for a split it does not declare
(`TextEnv.splits`) before its `_tasks` is asked. Datasets with no validation set of their own carve one out of
their train rows (`carve_validation`). Subclasses implement `_reset(task_id)` and
`_step(action)` and describe their tasks; `EpisodicEnv` turns that into the `TextEnv` contract.
"""

from __future__ import annotations

import dataclasses
import os
import random
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from environments.base import EnvError, EnvSpec, ResetNeededError, StepResult, TextEnv, check_split


class UnknownTaskError(EnvError, ValueError):
    """reset() was given a task id this environment does not hand out."""


def resolve_cache_dir(cache_dir: str | Path | None) -> Path:
    """Where generated games live: the given directory, else $AGENT_RUNTIME_CACHE/games, else
    ~/.cache/agent-runtime/games."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("AGENT_RUNTIME_CACHE", "~/.cache/agent-runtime")).expanduser() / "games"


class IndexedTasks(Sequence[str]):
    """A lazy, reproducible list of task ids "<split>-<index>" (cheap even for huge splits)."""

    def __init__(self, split: str, count: int) -> None:
        self.split, self.count = split, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(index)
        return f"{self.split}-{index}"

    def __contains__(self, task_id: object) -> bool:
        index = parse_indexed_task(task_id, self.split)
        return index is not None and index < self.count


class CarvedTasks(Sequence[str]):
    """The train task ids "train-<row>" of the rows left to train once validation rows are carved out: each id
    keeps its row number, so a train id names the same row as before the carve (with gaps where validation's are)."""

    def __init__(self, rows: int, carved: Sequence[int]) -> None:
        self._carved = frozenset(carved)
        self._rows = [row for row in range(rows) if row not in self._carved]

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [f"train-{row}" for row in self._rows[index]]
        return f"train-{self._rows[index]}"

    def __contains__(self, task_id: object) -> bool:
        row = parse_indexed_task(task_id, "train")
        return row is not None and row < len(self._rows) + len(self._carved) and row not in self._carved


def carve_validation(env_id: str, rows: int, n_validation: int | None) -> list[int]:
    """The train rows that form the validation fold of a dataset with no validation set of its own: `n_validation`
    rows evenly spaced over the train list (so they follow its order's mix, say of topics, rather than its tail);
    None: a tenth of the rows, at most 200 and at least 1. Train then hands out the other rows (`CarvedTasks`)."""
    if n_validation is None:
        n_validation = max(1, min(200, rows // 10))
    if isinstance(n_validation, bool) or not isinstance(n_validation, int) or not 1 <= n_validation < rows:
        raise EnvError(
            f"{env_id}: n_validation must be an integer from 1 to {rows - 1} (the train set has {rows} rows, and "
            f"validation is carved out of them leaving at least one to train), got {n_validation!r}"
        )
    return [(2 * j + 1) * rows // (2 * n_validation) for j in range(n_validation)]


class DatasetSplits:
    """The task ids of a dataset's splits, given its train and eval row counts, with validation carved out of the
    train rows (`carve_validation`): "train-<row>" and "eval-<row>" name rows of their lists, as they did before
    validation existed, and "validation-<i>" the i-th carved train row."""

    def __init__(self, env_id: str, train_rows: int, eval_rows: int, n_validation: int | None) -> None:
        self.validation_rows = carve_validation(env_id, train_rows, n_validation)
        self.tasks: dict[str, Sequence[str]] = {
            "train": CarvedTasks(train_rows, self.validation_rows),
            "validation": IndexedTasks("validation", len(self.validation_rows)),
            "eval": IndexedTasks("eval", eval_rows),
        }

    def row(self, task_id: str) -> tuple[str, int]:
        """(the list that holds the task's row, "train" or "eval"; the row) of a task id these splits hand out."""
        for split in ("train", "eval"):
            index = parse_indexed_task(task_id, split)
            if index is not None:
                return split, index
        index = parse_indexed_task(task_id, "validation")
        assert index is not None, task_id  # validated by EpisodicEnv.pick_task
        return "train", self.validation_rows[index]


def parse_indexed_task(task_id: object, split: str) -> int | None:
    """The index of "<split>-<index>", or None when `task_id` does not have that shape."""
    if not isinstance(task_id, str) or not task_id.startswith(split + "-"):
        return None
    tail = task_id[len(split) + 1 :]
    return int(tail) if tail.isdigit() else None


class EpisodicEnv(TextEnv):
    """A TextEnv with a step budget and reset/step bookkeeping; subclasses fill in the game."""

    def __init__(self, spec: EnvSpec, *, max_steps: int | None = None) -> None:
        if max_steps is not None:
            if not isinstance(max_steps, int) or max_steps < 1:
                raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
            spec = dataclasses.replace(spec, max_steps=max_steps)
        self.spec = spec
        self._active = False
        self._steps = 0
        self._task_id: str | None = None

    # -- what subclasses provide -------------------------------------------------------------
    @abstractmethod
    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """Start `task_id` (already validated); return (observation, info)."""

    @abstractmethod
    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply `action`; return (observation, reward, terminated, info)."""

    def _valid_task(self, task_id: str) -> bool:
        return any(task_id in self.tasks(split) for split in self.splits)

    # -- the contract ------------------------------------------------------------------------
    @property
    def task_id(self) -> str | None:
        """The task of the current (or last) episode."""
        return self._task_id

    def pick_task(self, seed: int | None, task_id: str | None) -> str:
        """`task_id` when given, else a train task chosen by `seed` (random when both are None)."""
        if task_id is not None:
            if not self._valid_task(task_id):
                looks = " or ".join(
                    f"{tasks[0]!r} ({split}: {len(tasks)} tasks)"
                    for split, tasks in ((split, self.tasks(split)) for split in self.splits)
                    if len(tasks)
                )
                raise UnknownTaskError(f"{self.spec.id} has no task {task_id!r}; task ids look like {looks}")
            return task_id
        train = self.tasks("train")
        index = seed % len(train) if seed is not None else random.randrange(len(train))
        return train[index]

    def reset(self, *, seed: int | None = None, task_id: str | None = None) -> tuple[str, dict[str, Any]]:
        task = self.pick_task(seed, task_id)
        self._active = False  # a reset that raises leaves no half-started episode to step into
        observation, info = self._reset(task)
        self._task_id, self._active, self._steps = task, True, 0
        return observation, info

    def step(self, action: str) -> StepResult:
        if not self._active:
            raise ResetNeededError(
                f"{self.spec.id}: call reset() before step()"
                if self._task_id is None
                else f"{self.spec.id}: the episode on {self._task_id!r} has ended; call reset()"
            )
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        observation, reward, terminated, info = self._step(action)
        self._steps += 1
        truncated = not terminated and self._steps >= self.spec.max_steps
        if terminated or truncated:
            self._active = False
        return StepResult(observation, float(reward), bool(terminated), truncated, info)

    def tasks(self, split: str) -> Sequence[str]:
        check_split(split, self)
        return self._tasks(split)

    @abstractmethod
    def _tasks(self, split: str) -> Sequence[str]:
        """The task ids of a (validated) split, one of `self.splits`."""
