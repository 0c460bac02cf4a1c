"""Lessons induced from evidence: what separates the run's won episodes from its lost ones, in plain words.

What: `induce(episodes, *, min_support=2, min_gap=0.3, max_candidates=6, known=()) -> list[Finding]`. Each finding
is a short lesson (a template filled with the environment's own action words) with the counts and episode ids
behind it, best first. No model writes anything: a 135M model's free extraction is vague prose, while its
episodes already hold the evidence (what was done, when it could have been done, in which order).

How, for every environment that lists admissible actions (or plays fixed moves: the actions it ever took
stand in for the list):
- an action *key* is an action itself ("take coin"), or its verb when the verb covers several actions ("go"
  for "go south" and "go west": which direction wins is a detail of one task, going is the rule);
- at every step where a key was available, the step either chose it or not; per key, the share of such steps
  that chose it in won episodes (`p_won`) against lost ones (`p_lost`);
- **prefer**: `p_won - p_lost >= min_gap`, chosen at least `min_support` times in won episodes
  -> "When you see a coin, take coin." (the object named as the observations before it named it, when they all
  did) / "When you can go, go." (a verb names an example action only when every won episode that used the verb
  chose that same action: "When you can go, go: for example go south.");
- **avoid**: `p_lost - p_won >= min_gap`, chosen at least `min_support` times in lost episodes
  -> "Look never helps.";
- **start**: the same comparison on the first step only (the order of play) -> "Go first." (only when it
  says more than the prefer finding of the same key);
- **repeat**: lost episodes that chose the same action twice in a row while the observation did not change,
  against won ones -> "If an action changed nothing, choose another one."
Findings are ranked by a two-proportion z statistic (how surely the two rates differ given their counts), and
a key appears once (its best finding). Action names are environment text, and an adversarial environment can
name an action "ignore the earlier lessons": a name is used only when it reads as a move of the game
(`safety.action_name_problem`: not prose, no instruction to the reader, nothing addressed to the model, system
or user, nothing about the lessons, the prompt or other tasks; a refused name is no key, and a step that chose
it chose none), and every finished text passes the lesson screen (`screen_item`) like an extracted lesson.

Why templates and not the model: they cannot be vague, they carry their evidence, and a wrong one is cheap to
reject -- each candidate is then tried on train tasks before it goes live (the runtime's EXTRACT phase with
`lessons.induce`), because a rule that separates won from lost play need not *cause* wins (a verb that
primes the small model can lower success: measured in bench/RESULTS.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from distill.lessons.curate import restates
from distill.lessons.safety import action_name_problem, screen_item

if TYPE_CHECKING:
    from memory import EpisodeInfo

KINDS = ("prefer", "avoid", "start", "repeat")


@dataclass(frozen=True)
class Finding:
    """One induced lesson with its evidence: the counts behind the two rates and the episodes they came from."""

    text: str
    kind: str  # one of KINDS
    key: str  # the action or verb the finding is about ("" for repeat)
    env_id: str
    chose_won: int  # steps (or episodes, for start/repeat) of won episodes that did it
    avail_won: int  # ... out of those where it could be done
    chose_lost: int
    avail_lost: int
    z: float  # two-proportion z statistic of the difference
    won_episode_ids: tuple[int, ...] = field(default_factory=tuple)
    lost_episode_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def p_won(self) -> float:
        return self.chose_won / self.avail_won if self.avail_won else 0.0

    @property
    def p_lost(self) -> float:
        return self.chose_lost / self.avail_lost if self.avail_lost else 0.0

    def evidence(self) -> dict[str, Any]:
        """What a reader needs to check the lesson: stored with it and shown by `lessons show` and the dashboard."""
        out = asdict(self)
        out.pop("text")
        out["won_episode_ids"], out["lost_episode_ids"] = list(self.won_episode_ids), list(self.lost_episode_ids)
        out["p_won"], out["p_lost"] = round(self.p_won, 4), round(self.p_lost, 4)
        out["z"] = round(self.z, 3)
        out["summary"] = self.summary()
        return out

    def summary(self) -> str:
        unit = "episodes" if self.kind in ("start", "repeat") else "steps where it was possible"
        return (
            f"{self.kind} {self.key or 'a repeated action'}: won {self.chose_won}/{self.avail_won}, "
            f"lost {self.chose_lost}/{self.avail_lost} {unit} (z {self.z:.1f})"
        )


def z_statistic(a: int, n: int, b: int, m: int) -> float:
    """Two-proportion z of a/n against b/m (pooled variance); 0 when either side is empty or nothing varies."""
    if not n or not m:
        return 0.0
    pooled = (a + b) / (n + m)
    var = pooled * (1 - pooled) * (1 / n + 1 / m)
    return (a / n - b / m) / math.sqrt(var) if var > 0 else 0.0


def _words(action: str) -> str:
    return " ".join(action.lower().split())


def _verb(action: str) -> str:
    return action.split(" ", 1)[0]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _texts(kind: str, key: str, example: str | None, seen: str | None = None) -> str:
    """The plain-words lesson of a finding. A key that is a verb names one action it covers as an example; a
    preferred action whose object the won episodes saw before choosing it says so ("When you see a coin, take
    coin."). The wordings are the ones the 135M model acted on in a measurement on train games (bench/RESULTS.md
    "Wording of induced lessons"): "Go first." moved it where "Start with go." did not, and "When you see a
    coin" more than "When you can take coin" (15 of 40 train games against 5 for the old pair; none: 2)."""
    if kind == "repeat":
        return "If an action changed nothing, choose another one."
    if kind == "prefer":
        if seen is not None:
            return f"When you see {seen}, {key}."
        act = key if example is None else f"{key}: for example {example}"
        return f"When you can {key}, {act}."
    if kind == "avoid":
        return f"{_sentence(key)} never helps."
    return f"{_sentence(example or key)} first."  # start


_ARTICLE = re.compile(r"\b(a|an|the|some)\s+$", re.IGNORECASE)


def _seen_phrase(action: str, histories: Sequence[Sequence[str]]) -> str | None:
    """How what was seen before an action names its object ("a coin" for "take coin"), when every history
    does (each: the observations of one won episode up to the choice); None for a one-word action, or when
    the object was not always seen first."""
    parts = action.split(" ", 1)
    if len(parts) < 2 or not histories:
        return None
    obj = parts[1]
    pattern = re.compile(rf"\b{re.escape(obj)}\b", re.IGNORECASE)
    articles: dict[str, int] = {}
    for history in histories:
        # the latest mention: the sight nearest the choice ("There is a coin"), not the task's "find the coin"
        text, found = next(((t, m) for t in reversed(history) if (m := pattern.search(t))), ("", None))
        if found is None:
            return None
        article = _ARTICLE.search(text[: found.start()])
        word = article.group(1).lower() if article else ""
        articles[word] = articles.get(word, 0) + 1
    word = max(sorted(articles), key=articles.get)
    return f"{word} {obj}" if word else obj


@dataclass
class _Tally:
    chose_won: int = 0
    avail_won: int = 0
    chose_lost: int = 0
    avail_lost: int = 0
    won_ids: set[int] = field(default_factory=set)
    lost_ids: set[int] = field(default_factory=set)

    def gap(self) -> float | None:
        """The won side's choice rate minus the lost side's; None when either side never had the choice."""
        if not self.avail_won or not self.avail_lost:
            return None
        return self.chose_won / self.avail_won - self.chose_lost / self.avail_lost

    def add(self, won: bool, chose: bool, episode_id: int) -> None:
        if won:
            self.avail_won += 1
            self.chose_won += chose
            if chose:
                self.won_ids.add(episode_id)
        else:
            self.avail_lost += 1
            self.chose_lost += chose
            if chose:
                self.lost_ids.add(episode_id)


def _playable(episode: EpisodeInfo) -> bool:
    return episode.outcome != "error" and bool(episode.steps)


def induce(
    episodes: Iterable[EpisodeInfo],
    *,
    min_support: int = 2,
    min_gap: float = 0.3,
    max_candidates: int = 6,
    max_chars: int = 300,
    known: Sequence[str] = (),
) -> list[Finding]:
    """The findings that separate won from lost episodes (see the module doc), best first, one per key; a finding
    that only restates a `known` lesson or a better finding (`curate.restates`) is left out.

    Environments are taken separately (a rule of one game is not a rule of another); an environment needs at
    least one won and one lost episode, else it says nothing, and `max_candidates` is per environment: an
    environment with stronger evidence never takes another's candidates (each lesson is scoped to, and tried
    on, its own environment). `episodes` must carry their steps."""
    assert min_support >= 1 and 0 < min_gap <= 1 and max_candidates >= 1
    by_env: dict[str, list[EpisodeInfo]] = {}
    for episode in episodes:
        if _playable(episode):
            by_env.setdefault(episode.env_id, []).append(episode)
    findings: list[Finding] = []
    for env_id, group in sorted(by_env.items()):
        if any(e.won for e in group) and not all(e.won for e in group):
            findings += _induce_env(env_id, group, min_support, min_gap)
    findings.sort(key=lambda f: (-f.z, f.kind, f.key))
    chosen, seen_keys, seen_texts, per_env = [], set(), [], {}
    for finding in findings:
        if per_env.get(finding.env_id, 0) == max_candidates:
            continue
        verdict = screen_item(finding.text, max_chars)
        if (
            verdict.text is None
            or (finding.env_id, finding.key) in seen_keys
            or any(restates(verdict.text, other) for other in [*known, *seen_texts])
        ):
            continue
        seen_keys.add((finding.env_id, finding.key))
        seen_texts.append(verdict.text)
        per_env[finding.env_id] = per_env.get(finding.env_id, 0) + 1
        chosen.append(Finding(**{**asdict(finding), "text": verdict.text}))
    return chosen


def _usable(action: str) -> bool:
    """Whether an action name (environment text) may become lesson text: `safety.action_name_problem`."""
    return action_name_problem(action) is None


def _induce_env(env_id: str, episodes: Sequence[EpisodeInfo], min_support: int, min_gap: float) -> list[Finding]:
    fixed = sorted({_words(s.action) for e in episodes for s in e.steps if s.action})  # fixed moves' stand-in
    per_verb: dict[str, set[str]] = {}
    for e in episodes:
        for s in e.steps:
            for a in s.admissible_actions or fixed:
                if _usable(_words(a)):
                    per_verb.setdefault(_verb(_words(a)), set()).add(_words(a))
    verbs = {v for v, actions in per_verb.items() if len(actions) >= 2}

    def keys_of(action: str) -> list[str]:
        # an action of a verb with several objects ("go west") is a detail of one task: its verb is the rule
        return [_verb(action)] if _verb(action) in verbs else [action]

    anywhere: dict[str, _Tally] = {}
    first: dict[str, _Tally] = {}
    examples: dict[str, dict[str, int]] = {}  # verb -> chosen actions in won episodes (the example named)
    sights: dict[str, list[list[str]]] = {}  # action -> what won episodes had seen when they chose it
    repeat = _Tally()
    for e in episodes:
        repeated = False
        for i, s in enumerate(e.steps):
            if not s.action:
                continue
            chosen = _words(s.action)
            # a refused name is no key, and choosing it chooses none: the step still counts against the others
            usable = _usable(chosen)
            available = {_words(a) for a in (s.admissible_actions or fixed)} | {chosen}
            keys = {k for a in available if _usable(a) for k in keys_of(a)}
            for key in keys:
                picked = usable and key in keys_of(chosen)
                anywhere.setdefault(key, _Tally()).add(e.won, picked, e.id)
                if i == 0:
                    first.setdefault(key, _Tally()).add(e.won, picked, e.id)
            if e.won and usable:
                # the episode's observations so far: an object seen stays known after "inventory"
                sights.setdefault(chosen, []).append([x.observation or "" for x in e.steps[: i + 1]])
            if e.won and usable and _verb(chosen) in verbs:
                counts = examples.setdefault(_verb(chosen), {})
                counts[chosen] = counts.get(chosen, 0) + 1
            if (
                i
                and e.steps[i - 1].action
                and _words(e.steps[i - 1].action) == chosen
                and e.steps[i - 1].observation == s.observation
            ):
                repeated = True
        repeat.add(e.won, repeated, e.id)

    def example(key: str) -> str | None:
        # a verb's example only when the won episodes agree on one action of it: where they went different
        # ways, naming one primes the wrong one in other tasks ("Start with go: for example go west." lowered
        # success in every trial it had; measured in bench/RESULTS.md)
        counts = examples.get(key, {})
        if key not in verbs or len(counts) != 1:
            return None
        [(action, times)] = counts.items()
        return action if times >= min_support else None

    out: list[Finding] = []

    def finding(kind: str, key: str, tally: _Tally, won_side: bool) -> None:
        z = z_statistic(tally.chose_won, tally.avail_won, tally.chose_lost, tally.avail_lost)
        out.append(
            Finding(
                _texts(
                    kind,
                    key,
                    example(key),
                    _seen_phrase(key, sights.get(key, ())) if kind == "prefer" and key not in verbs else None,
                ),
                kind,
                key,
                env_id,
                tally.chose_won,
                tally.avail_won,
                tally.chose_lost,
                tally.avail_lost,
                z if won_side else -z,
                tuple(sorted(tally.won_ids)),
                tuple(sorted(tally.lost_ids)),
            )
        )

    for key, tally in anywhere.items():
        gap = tally.gap()
        if gap is not None and gap >= min_gap and tally.chose_won >= min_support:
            finding("prefer", key, tally, True)
        elif gap is not None and -gap >= min_gap and tally.chose_lost >= min_support:
            finding("avoid", key, tally, False)
    for key, tally in first.items():
        gap = tally.gap()
        if gap is not None and gap >= min_gap and tally.chose_won >= min_support:
            finding("start", key, tally, True)
    gap = repeat.gap()
    if gap is not None and -gap >= min_gap and repeat.chose_lost >= min_support:
        finding("repeat", "", repeat, False)
    return out
