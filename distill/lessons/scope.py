"""A lesson's scope: the environments whose prompts it may enter.

A lesson is evidence about the environment it came from, so scope is the default: a lesson induced or extracted
from an environment's episodes is scoped to that environment, and a wider scope is earned by a trial in each
environment it would enter (a person's lesson without `--env` is proposed for every environment of the run and
goes live in those where its trial raised success, never where it lowered it). Why: a lesson that helps in one
environment can mislead the model in another (the coin-collector lessons in context lowered treasure-hunter's
success: bench/RESULTS.md).

A scope is a list of entries, each one of:
- an environment id (`textworld/coin_collector`): that environment;
- `family:NAME` (`family:text`, `family:arena`, `family:math`): every environment of that prompt family;
- `*`: every environment (a store written before scopes existed migrates to this).

What:
- `normalize_scope(entries, known=None)`: the checked, de-duplicated scope (`ScopeError` naming what is accepted;
  with `known`, an environment id the run does not have is refused with the run's environments listed).
- `in_scope(scope, env_id, family)`: whether a lesson with `scope` may enter a prompt of that environment.
- `ScopedLesson(text, scope, id, gains)`: a lesson as the evaluations and the cycle take it (`scoped_lessons` from
  stored ones: their id and measured gains, what `distill.lessons.budget` ranks by); `in_scope_lessons(lessons,
  env_id, family)` keeps those in scope (a plain string is a lesson for every environment), `for_env` their texts.
- `describe_scope(scope)`: the scope as `lessons show` and the dashboard print it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from distill.lessons.errors import LessonsError

EVERYWHERE = "*"
GLOBAL: tuple[str, ...] = (EVERYWHERE,)
FAMILY = "family:"
MAX_ENTRIES = 64
MAX_ENTRY_CHARS = 200
# an environment id as the registry spells one (`pkg/name`, `module:Class`), or `family:NAME`
_ENTRY = re.compile(r"^[A-Za-z0-9_.:/@+-]+$")


class ScopeError(LessonsError, ValueError):
    """A scope entry that names no environment, family or `*`, or an environment the run does not have."""


class ScopedLesson(NamedTuple):
    text: str
    scope: tuple[str, ...] = GLOBAL
    id: int | None = None  # the stored lesson's (its place in the store's lesson index), None for a bare text
    gains: tuple[tuple[str, float], ...] = ()  # (env id, success its trials added there): `trial_gains`


def scoped_lessons(lessons: Iterable) -> list[ScopedLesson]:
    """Stored lessons (anything with `id`, `text`, `scope` and `metadata`) as they are put in prompts."""
    return [ScopedLesson(x.text, tuple(x.scope), x.id, tuple(sorted(trial_gains(x).items()))) for x in lessons]


def normalize_scope(
    entries: Iterable[str] | None, known: Sequence[str] | None = None, families: Sequence[str] | None = None
) -> tuple[str, ...]:
    """`entries` checked and de-duplicated, in order; `*` alone when it is among them; no entries is `*`.
    With `known` (the run's environment ids), an environment id outside it is refused; with `families` (the prompt
    families of the run's environments), a family:NAME outside them is refused too (the lesson would go live
    nowhere)."""
    out: list[str] = []
    for entry in [] if entries is None else list(entries):
        if entry == EVERYWHERE:
            return GLOBAL
        if not isinstance(entry, str) or not entry or len(entry) > MAX_ENTRY_CHARS or not _ENTRY.match(entry):
            shown = repr(entry)[:80]
            raise ScopeError(
                f"lesson scope entry {shown}: accepted are an environment id (e.g. textworld/coin_collector), "
                f"family:NAME (text, arena, math) or '*', at most {MAX_ENTRY_CHARS} characters of letters, digits "
                "and _ . : / @ + -"
            )
        if entry.startswith(FAMILY) and not entry[len(FAMILY) :]:
            raise ScopeError("lesson scope entry 'family:': name the family, e.g. family:text")
        if families is not None and entry.startswith(FAMILY) and entry[len(FAMILY) :] not in families:
            raise ScopeError(
                f"lesson scope {entry!r} names a family no environment of this run has; its families: "
                f"{', '.join(f'{FAMILY}{f}' for f in sorted(set(families))) or 'none'} (or an environment id, or '*')"
            )
        if known is not None and not entry.startswith(FAMILY) and entry not in known:
            raise ScopeError(
                f"lesson scope {entry!r} is not an environment of this run; its environments: "
                f"{', '.join(known) or 'none'} (or family:NAME, or '*' for all)"
            )
        if entry not in out:
            out.append(entry)
    if len(out) > MAX_ENTRIES:
        raise ScopeError(f"a lesson scope lists at most {MAX_ENTRIES} environments; got {len(out)}")
    return tuple(out) if out else GLOBAL


def in_scope(scope: Iterable[str] | None, env_id: str, family: str | None = None) -> bool:
    """Whether a lesson of `scope` may enter a prompt of environment `env_id` (of prompt family `family`)."""
    entries = GLOBAL if scope is None else tuple(scope)
    return any(
        entry == EVERYWHERE
        or entry == env_id
        or (family is not None and entry.startswith(FAMILY) and entry[len(FAMILY) :] == family)
        for entry in entries
    )


def is_global(scope: Iterable[str] | None) -> bool:
    return scope is None or EVERYWHERE in tuple(scope)


def in_scope_lessons(
    lessons: Iterable[str | ScopedLesson], env_id: str, family: str | None = None
) -> list[ScopedLesson]:
    """The `lessons` in scope for `env_id`, in order; a plain string is a lesson for every environment."""
    scoped = (ScopedLesson(x) if isinstance(x, str) else x for x in lessons)
    return [x for x in scoped if in_scope(x.scope, env_id, family)]


def for_env(lessons: Iterable[str | ScopedLesson], env_id: str, family: str | None = None) -> list[str]:
    """The texts of `lessons` in scope for `env_id` (a plain string is in scope everywhere), in order."""
    return [x.text for x in in_scope_lessons(lessons, env_id, family)]


def describe_scope(scope: Iterable[str] | None) -> str:
    entries = GLOBAL if scope is None else tuple(scope)
    return "all environments" if EVERYWHERE in entries else ", ".join(entries)


def trial_gains(lesson) -> dict[str, float]:
    """What a stored lesson's trials measured it to add to success, per environment id: its own trial in each
    environment (`scope_trials`: a lesson proposed for every environment), else its one trial (`trial`: an induced
    lesson, tried on the environments its scope names). Empty when it was never tried (the gate off, a seed)."""
    metadata = lesson.metadata or {}
    per_env = metadata.get("scope_trials")
    if isinstance(per_env, dict):
        return {env: d["delta"] for env, d in per_env.items() if isinstance(d, dict) and _measured(d.get("delta"))}
    trial = metadata.get("trial")
    if isinstance(trial, dict) and _measured(trial.get("delta")):
        return {env: trial["delta"] for env in lesson.scope or () if env != EVERYWHERE}
    return {}


def _measured(delta) -> bool:
    """A success-rate difference as a trial stores it (a finite number in [-1, 1]; not a bool, not NaN)."""
    return isinstance(delta, int | float) and not isinstance(delta, bool) and -1.0 <= delta <= 1.0
