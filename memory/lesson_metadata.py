"""What a lesson's metadata may hold: the keys the runtime writes, each of one type and range, checked on import.

What: `lesson_metadata_problem(metadata) -> str | None` says what is wrong with a lesson's `metadata` ("metadata.
trial.n must be a count (an integer from 0 to 2147483647), got '<b>24</b>'"), or None; `LESSON_METADATA` is the
schema, key -> what its value must be. `memory import` (`memory.transfer`) refuses an export holding a lesson whose
metadata has a problem, naming the line and the lesson, and imports nothing.

Why: an export is data from elsewhere, and a lesson's metadata is read as if the runtime had written it: the
dashboard links its evidence's episode ids and prints its trial's numbers, `lessons show` indexes its evidence,
curation and the gate follow `merged_from`, the version history follows `target` and `replaces`. A value of
another type (`won_episode_ids: ["<script>..."]`, `trial.n: "<b>24</b>"`) is shown escaped, but it reads as
evidence that never was, or fails later with a traceback far from the file that carried it.

The keys (who writes them):
- `source` (a person's lesson: `distill.lessons.user_lessons`), `forgotten` (the reason, `lessons forget`): texts.
- `op` ("update") and `target` (an UPDATE of the extractor), `replaces` and `proposed_as` (a conflict's
  replacement), `merged_from`, `merged_texts` and `extraction_ids` (a merge: `distill.lessons.curate`): ids and
  texts.
- `evidence`, `trial`, `accepted` (an induced lesson, `agent_runtime.phases.extract`): the finding's counts, rates,
  z and episode ids (`distill.lessons.induce.Finding.evidence`), and the gate's decision on its trial
  (`distill.lessons.gate.GateDecision.to_dict`, without its keys).
- `proposed_scope` and `scope_trials` (a lesson narrowed to the environments whose trial let it in:
  `distill.lessons.golive`): the scope it was proposed with, and per environment the gate's decision with
  the number of its games (`keys`); where its own trial let it in beside others tried alone, the combination's
  decision there as `together`, with the other lessons' ids (`with`).
Ids are integers from 1 to 2**31 - 1 (the store's ids), counts integers from 0, rates numbers in [0, 1], a
difference of rates and its interval in [-1, 1], other numbers finite; texts are strings of at most
`MAX_TEXT_CHARS` characters (an environment id or scope entry at most 200, as the column).

A key the runtime does not write is refused, at the top and inside `evidence` and `trial`: the runtime is the only
writer of a lesson's metadata, so an unknown key means an edited file or a writer this version does not know, and
refusing is what keeps a store's metadata readable by the code that reads it. A key the runtime starts writing is
added here with its type (tests/memory/test_memory_import_metadata.py exports a store holding every kind of lesson the
runtime writes and checks that its keys are exactly these). An object's keys are all required, as its writer
writes them all (`lessons show` reads `evidence["summary"]` unguarded), except those marked optional.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from memory.transfer_rows import INT_MAX

MAX_TEXT_CHARS = 10_000
MAX_NAME_CHARS = 200  # an environment id, a scope entry (the columns' length)
MAX_SCOPE_ENTRIES = 64
EVIDENCE_KINDS = ("prefer", "avoid", "start", "repeat")  # distill.lessons.induce.KINDS

# A check takes (value, where) and returns a problem ("<where> must be ..., got ...") or None.
Check = Callable[[Any, str], "str | None"]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _check(accepted: str, ok: Callable[[Any], bool]) -> Check:
    def check(value: Any, where: str) -> str | None:
        return None if ok(value) else f"{where} must be {accepted}, got {_show(value)}"

    return check


ID = _check(f"an id (an integer from 1 to {INT_MAX})", lambda v: _is_int(v) and 1 <= v <= INT_MAX)
COUNT = _check(f"a count (an integer from 0 to {INT_MAX})", lambda v: _is_int(v) and 0 <= v <= INT_MAX)
RATE = _check("a rate (a number from 0 to 1)", lambda v: _is_number(v) and 0 <= v <= 1)
DIFFERENCE = _check("a difference of rates (a number from -1 to 1)", lambda v: _is_number(v) and -1 <= v <= 1)
NUMBER = _check("a finite number", _is_number)
AMOUNT = _check("a finite number from 0", lambda v: _is_number(v) and v >= 0)
BOOL = _check("true or false", lambda v: isinstance(v, bool))


def _text(max_chars: int) -> Check:
    return _check(f"a string of at most {max_chars} characters", lambda v: isinstance(v, str) and len(v) <= max_chars)


TEXT = _text(MAX_TEXT_CHARS)
NAME = _text(MAX_NAME_CHARS)


def _one_of(*values: str) -> Check:
    return _check(f"one of {', '.join(repr(v) for v in values)}", lambda v: isinstance(v, str) and v in values)


def _pair(low: float, high: float) -> Check:
    """An interval: [lower, upper], both in [low, high], lower <= upper."""
    return _check(
        f"a pair [lower, upper] of numbers from {low:g} to {high:g}, lower <= upper",
        lambda v: (
            isinstance(v, list) and len(v) == 2 and all(_is_number(x) and low <= x <= high for x in v) and v[0] <= v[1]
        ),
    )


def _list(item: Check, max_items: int | None = None) -> Check:
    limit = "" if max_items is None else f" of at most {max_items} items"

    def check(value: Any, where: str) -> str | None:
        if not isinstance(value, list) or (max_items is not None and len(value) > max_items):
            return f"{where} must be a list{limit}, got {_show(value)}"
        return next((p for i, x in enumerate(value) if (p := item(x, f"{where}[{i}]"))), None)

    return check


def _object(fields: dict[str, Check], optional: tuple[str, ...] = ()) -> Check:
    """A JSON object with exactly `fields` (those in `optional` may be left out), each passing its check."""
    accepted = ", ".join(fields)

    def check(value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} must be an object with the keys {accepted}, got {_show(value)}"
        unknown = [k for k in value if k not in fields]
        if unknown:
            return f"{where} has the unknown key {unknown[0]!r}; accepted keys: {accepted}, got {_show(value)}"
        missing = [k for k in fields if k not in value and k not in optional]
        if missing:
            shown = f"got {_show(value)}"
            return f"{where} is missing {', '.join(missing)}; accepted is an object with the keys {accepted}, {shown}"
        return next((p for k, x in value.items() if (p := fields[k](x, f"{where}.{k}"))), None)

    return check


def _mapping(key: Check, item: Check, max_items: int) -> Check:
    def check(value: Any, where: str) -> str | None:
        if not isinstance(value, dict) or len(value) > max_items:
            return f"{where} must be an object of at most {max_items} entries, got {_show(value)}"
        for k, x in value.items():
            problem = key(k, f"{where} (a key)") or item(x, f"{where}.{k}")
            if problem:
                return problem
        return None

    return check


EVIDENCE = _object(
    {
        "kind": _one_of(*EVIDENCE_KINDS),
        "key": TEXT,
        "env_id": NAME,
        "chose_won": COUNT,
        "avail_won": COUNT,
        "chose_lost": COUNT,
        "avail_lost": COUNT,
        "z": NUMBER,
        "won_episode_ids": _list(ID),
        "lost_episode_ids": _list(ID),
        "p_won": RATE,
        "p_lost": RATE,
        "summary": TEXT,
    }
)
_DECISION = {
    "promote": BOOL,
    "reason": TEXT,
    "n": COUNT,
    "margin": RATE,
    "current_successes": AMOUNT,
    "candidate_successes": AMOUNT,
    "current_rate": RATE,
    "candidate_rate": RATE,
    "delta": DIFFERENCE,
    "current_ci": _pair(0, 1),
    "candidate_ci": _pair(0, 1),
    "delta_ci": _pair(-1, 1),
}
TRIAL = _object(_DECISION)
TOGETHER = _object(_DECISION | {"keys": COUNT, "with": _list(ID, MAX_SCOPE_ENTRIES)})
SCOPE_TRIAL = _object(_DECISION | {"keys": COUNT, "together": TOGETHER}, optional=("together",))

LESSON_METADATA: dict[str, Check] = {
    "source": NAME,
    "forgotten": TEXT,
    "op": _one_of("update"),
    "target": ID,
    "replaces": ID,
    "proposed_as": ID,
    "merged_from": _list(ID),
    "merged_texts": _list(TEXT),
    "extraction_ids": _list(ID),
    "evidence": EVIDENCE,
    "trial": TRIAL,
    "accepted": BOOL,
    "proposed_scope": _list(NAME, MAX_SCOPE_ENTRIES),
    "scope_trials": _mapping(NAME, SCOPE_TRIAL, MAX_SCOPE_ENTRIES),
}
_CHECK = _object(LESSON_METADATA, optional=tuple(LESSON_METADATA))


def lesson_metadata_problem(metadata: Any) -> str | None:
    """What is wrong with a lesson's metadata ("metadata.<field> must be <what is accepted>, got <what was
    given>"), or None when every key is one the runtime writes, with a value of its type and range."""
    return _CHECK(metadata, "metadata")
