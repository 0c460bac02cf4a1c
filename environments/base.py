"""The environment contract: one small module that every text environment implements.

Gymnasium-shaped, but observations and actions are text. An environment hands out reproducible task
ids per split, is reset onto one of them (or onto a seed), and is stepped with the agent's action string. The
splits (`SPLITS`) are pairwise disjoint folds of one task distribution, by task id and by game: "train" is what
the agent plays and learns from, "eval" the held-out games that tables report, and "validation" the games that
decisions (the lesson gate, an adapter's promotion) are taken on, so that choosing on them never spends eval.
An environment says which splits it hands out (`TextEnv.splits`); one written for train and eval alone has no
validation fold, and asking it for one is a `MissingSplitError` saying what to implement, never train or eval
tasks lent under another name. Rewards are per step: adapters for games that keep a cumulative score turn it
into differences. `info` has reserved keys every consumer may rely on:

- ``admissible_actions``: list[str], when the game knows them (absent otherwise)
- ``won``: bool, set on the terminal step (True only on success)
- ``score``: the game's own cumulative score, when it has one
- ``goal``: the task's goal text, when it has one

`check_env` (environments/checker.py) enforces this contract; plugin authors run it through
``agent-runtime envs check``.

What the runtime keeps of an environment's text is capped, so that one game answering with megabytes cannot fill
the model's context, the experience store or the dashboard: an observation (and the goal) longer than
`MAX_OBSERVATION_CHARS` is cut there with a visible marker (`cap_text`) before the prompt or the store sees it, and
an admissible action longer than `MAX_ACTION_CHARS` is not offered (cut, it would no longer be the game's action).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

RESERVED_INFO_KEYS = ("admissible_actions", "won", "score", "goal")
SPLITS = ("train", "validation", "eval")
# Far above what a working game says (a TextWorld cooking room is ~1,000 characters, a command ~40), so that only a
# runaway environment is cut.
MAX_OBSERVATION_CHARS = 16_384
MAX_ACTION_CHARS = 1_024


def cap_text(text: str, limit: int) -> str:
    """`text` as the runtime keeps it: unchanged up to `limit` characters, else its first `limit` characters and a
    marker that says how long it was ("… [truncated: 8,388,608 characters, kept 16,384]")."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [truncated: {len(text):,} characters, kept {limit:,}]"


class StepResult(NamedTuple):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict


@dataclass(frozen=True)
class EnvSpec:
    """What the registry and the runtime know about an environment without instantiating games."""

    id: str
    version: str = "0"
    max_steps: int = 50
    family: str = "text"  # "text" (command games), "arena" (bracketed moves), "math" (one-step answers)
    description: str = ""
    kwargs: dict = field(default_factory=dict)


class EnvError(Exception):
    """Base class for environment errors that users or plugin authors can act on."""


class UnknownEnvironmentError(EnvError, KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class MissingSplitError(EnvError, LookupError):
    """tasks() was asked for a split of the contract that this environment does not hand out (`TextEnv.splits`)."""


class ResetNeededError(EnvError, RuntimeError):
    """step() was called before reset() or after the episode ended."""


class TextEnv(ABC):
    """A text environment. Subclasses set `spec` and implement tasks/reset/step."""

    spec: EnvSpec
    # The splits this environment hands out. The contract asks for every one of SPLITS; an environment that does
    # not declare "validation" was written for train and eval alone, and gets MissingSplitError for it.
    splits: tuple[str, ...] = ("train", "eval")

    @abstractmethod
    def tasks(self, split: str) -> Sequence[str]:
        """Reproducible task ids of a split (one of SPLITS); the splits are pairwise disjoint."""

    @abstractmethod
    def reset(self, *, seed: int | None = None, task_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on `task_id` (or a task chosen by `seed`); return (observation, info)."""

    @abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one action. Raises ResetNeededError before reset or after the episode ended."""

    def close(self) -> None:
        """Release resources. Calling it twice is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_split(split: str, env: TextEnv | None = None) -> None:
    """Raise ValueError for a split name outside SPLITS, and, given `env`, MissingSplitError for a split it does not
    hand out (naming what to implement)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; accepted: {', '.join(SPLITS)}")
    if env is not None and split not in env.splits:
        env_id = getattr(getattr(env, "spec", None), "id", type(env).__name__)
        raise MissingSplitError(
            f"{env_id} hands out no {split!r} tasks: it declares the splits {', '.join(env.splits)}, and the contract "
            f"has {', '.join(SPLITS)}. Implement the {split} fold (task ids and games of its own, disjoint from the "
            f"other splits', from the same distribution; see docs/environments.md) and declare "
            f"`splits = environments.base.SPLITS` on the class"
        )
