"""How a step's prompt is stored: what it can be rebuilt from, never the whole text again.

Why: a prompt is the whole conversation so far (system prompt, lessons, every earlier observation and
reply), so storing each step's prompt whole grows quadratically with an episode's length and repeats
the system part in every episode, so on a small game a step's stored prompt is many times its observation
(bench/RESULTS.md, "Storage per step").
Two facts make it cheap to store exactly:
- within an episode, each turn's prompt extends the previous one (its prompt, the reply, the next
  observation); when the history is trimmed to fit the context, one block of old turns is cut out of
  the middle and the rest still follows;
- the first prompt's system part (system prompt + lessons, up to the first observation) is the same in
  every episode played with the same lessons.

So a step row holds a recipe (the `steps` columns named below) and only the text nothing else has:

    prompt = part + base[:keep] + base[resume:] + own        (own with the observation put back at `at`)

- part: `prompt_parts.text` of `prompt_part_id`, a content-addressed text (sha256), stored once;
- base: the full prompt of the step `prompt_base` (a smaller step index, same episode), of which the
  first `prompt_keep` characters and, if `prompt_resume` is set, the characters from there to its end;
- own: the `prompt` column; the step's stripped observation (already in the `observation` column) is
  inserted at `prompt_observation_at` when that is set.
Any recipe rebuilds the exact text; the encoder only decides how little `own` keeps. The memory does not
parse prompts: it knows no chat template, only common prefixes, a cut-out block and the observation.
Text is taken as stored (NUL as U+FFFD), so a rebuilt prompt equals what the database held before.

`PromptEncoder` makes recipes (one instance per write transaction: the store, the importer) and
`part_id` stores a part once; `rebuild_prompts` turns the recipes of one episode back into texts, and
`stored_prompts` reads and rebuilds the prompts of some episodes (the store's reads, the exporter).
The migration 0003 converts older databases with its own copy of these rules.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.dialects import postgresql, sqlite

from memory.engine import without_nul
from memory.models import PromptPart, Step

RECIPE_COLUMNS = ("prompt_part_id", "prompt_base", "prompt_keep", "prompt_resume", "prompt_observation_at")
MIN_PART = 32  # a shorter shared part is not worth a row and a reference
MIN_TAIL = 32  # a shorter reused tail is not worth a column
PROBE = 48  # characters looked up in the base to find where its reused tail starts
MAX_PROBES = 32
MIN_OBSERVATION = 8  # a shorter observation is stored in `own` as it is


def digest(text: str) -> str:
    """The key of a prompt part: sha256 of its UTF-8 text, in hex."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix (the common case, b extends a, costs one comparison)."""
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search on slice equality: C-speed comparisons instead of a Python loop
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _tail_start(base: str, prompt: str, keep: int) -> int | None:
    """The smallest m >= keep such that base[m:] continues `prompt` at `keep` (a block of the base cut
    out after its first `keep` characters), when the reused tail is long enough to be worth it."""
    probe = prompt[keep : keep + PROBE]
    if len(probe) < MIN_TAIL:
        return None
    position = base.find(probe, keep)
    for _ in range(MAX_PROBES):
        if position < 0 or len(base) - position < MIN_TAIL:
            return None
        if prompt.startswith(base[position:], keep):
            return position
        position = base.find(probe, position + 1)
    return None


@dataclass
class Recipe:
    """One step's stored prompt: the `steps` columns (see the module docstring)."""

    own: str
    part: str | None = None  # the part's text (the store turns it into `prompt_part_id`)
    base: int | None = None
    keep: int | None = None
    resume: int | None = None
    observation_at: int | None = None

    def columns(self, part_id: int | None) -> dict[str, Any]:
        return {
            "prompt": self.own,
            "prompt_part_id": part_id,
            "prompt_base": self.base,
            "prompt_keep": self.keep,
            "prompt_resume": self.resume,
            "prompt_observation_at": self.observation_at,
        }


class PromptEncoder:
    """Recipes for the steps of episodes, in the order they are written (one instance per transaction).

    `encode(episode_key, index, observation, prompt)` remembers each episode's newest step, the base
    of its next one. A step without a usable base (an episode's first) takes what precedes its
    observation as a part; a later step never makes a part (its history would be a new part each time).
    """

    def __init__(self, *, max_episodes: int | None = None) -> None:
        self._last: dict[Any, tuple[int, str]] = {}  # insertion-ordered: the oldest episode goes first
        self.max_episodes = max_episodes  # an import of a million episodes must not keep every last prompt

    def encode(self, episode: Any, index: int, observation: str, prompt: str) -> Recipe:
        prompt, observation = without_nul(prompt), without_nul(observation)
        best = Recipe(own=prompt)
        previous = self._last.get(episode)
        if previous is not None and previous[0] < index:
            base_index, base = previous
            keep = _common_prefix(base, prompt)
            resume = _tail_start(base, prompt, keep) if keep < len(base) else None
            reused = keep + (len(base) - resume if resume is not None else 0)
            if reused >= MIN_PART:
                best = Recipe(own=prompt[reused:], base=base_index, keep=keep, resume=resume)
        shown = observation.strip()
        if best.base is None:  # the first step: what comes before its observation is the shared part
            cut = prompt.rfind(shown) if len(shown) >= MIN_OBSERVATION else -1
            if cut >= MIN_PART:
                best = Recipe(own=prompt[cut:], part=prompt[:cut])
        if len(shown) >= MIN_OBSERVATION:
            at = best.own.rfind(shown)
            if at >= 0:
                best.own = best.own[:at] + best.own[at + len(shown) :]
                best.observation_at = at
        self._last.pop(episode, None)
        self._last[episode] = (index, prompt)
        if self.max_episodes is not None and len(self._last) > self.max_episodes:
            del self._last[next(iter(self._last))]
        return best


class RecipeError(AssertionError):
    """A stored recipe that does not rebuild (the store wrote it, so this is a bug or a damaged row)."""


def rebuild_prompts(rows: Iterable[Mapping[str, Any]], parts: Mapping[int, str]) -> dict[int, str]:
    """Step index -> full prompt, for the steps of ONE episode given as rows with `step_index`,
    `observation`, `prompt` and the recipe columns, in any order; `parts` maps part ids to texts."""
    out: dict[int, str] = {}
    for row in sorted(rows, key=lambda r: r["step_index"]):
        own = row["prompt"]
        at = row["prompt_observation_at"]
        if at is not None:
            own = own[:at] + row["observation"].strip() + own[at:]
        head = ""
        if row["prompt_part_id"] is not None:
            if row["prompt_part_id"] not in parts:
                raise RecipeError(f"step {row['step_index']}: prompt part {row['prompt_part_id']} is missing")
            head = parts[row["prompt_part_id"]]
        if row["prompt_base"] is not None:
            base = out.get(row["prompt_base"])
            if base is None:
                raise RecipeError(f"step {row['step_index']}: its base step {row['prompt_base']} is missing")
            head += base[: row["prompt_keep"]]
            if row["prompt_resume"] is not None:
                head += base[row["prompt_resume"] :]
        out[row["step_index"]] = head + own
    return out


PARTS = PromptPart.__table__
STEPS = Step.__table__
RECIPE_SELECT = (
    STEPS.c.episode_id,
    STEPS.c.step_index,
    STEPS.c.observation,
    STEPS.c.prompt,
    *(STEPS.c[name] for name in RECIPE_COLUMNS),
)


def part_id(conn: Connection, text: str, known: dict[str, int]) -> int:
    """The id of the part with this text, inserted if new; `known` caches ids for one transaction only
    (a rolled-back insert must not be remembered).

    No lock is held on an existing part: concurrent writers share the system part, and locking it would
    serialise their commits. A `memory prune` that deletes the part (because no step used it any more)
    between this lookup and the step's insert makes that insert fail its foreign key, and the episode's
    write fails whole (the loop writes it again); the database never holds a step without its part."""
    key = digest(text)
    if key not in known:
        lookup = select(PARTS.c.id).where(PARTS.c.digest == key)
        found = conn.execute(lookup).scalar()  # the common case: the part is there (one statement)
        if found is None:
            insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(PARTS)
            conn.execute(insert.values(digest=key, text=text).on_conflict_do_nothing(index_elements=["digest"]))
            found = conn.execute(lookup).scalar_one()
        known[key] = found
    return known[key]


def stored_prompts(
    conn: Connection, episode_ids: Sequence[int], *, up_to: int | None = None
) -> dict[tuple[int, int], str]:
    """(episode id, step index) -> full prompt for the steps of `episode_ids` (only indexes <= `up_to`
    when given: a step's base always has a smaller index)."""
    query = select(*RECIPE_SELECT).where(STEPS.c.episode_id.in_(list(episode_ids)))
    if up_to is not None:
        query = query.where(STEPS.c.step_index <= up_to)
    rows = [dict(r) for r in conn.execute(query).mappings()]
    wanted = {r["prompt_part_id"] for r in rows if r["prompt_part_id"] is not None}
    parts = dict(conn.execute(select(PARTS.c.id, PARTS.c.text).where(PARTS.c.id.in_(wanted))).all()) if wanted else {}
    by_episode: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_episode.setdefault(row["episode_id"], []).append(row)
    out: dict[tuple[int, int], str] = {}
    for episode_id, steps in by_episode.items():
        for index, text in rebuild_prompts(steps, parts).items():
            out[(episode_id, index)] = text
    return out
