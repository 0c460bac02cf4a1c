"""What a long-lived run's round left beside its assessment rows, and each family's course over the rounds: plain
data, read defensively (a store may hold rows from an import), shared by `agent_runtime.evaluation.rounds` (which
writes the records and prints them) and the dashboard (which shows them and imports nothing but the store).

A round record (`metrics.continual.round` of each environment's assessment row): per environment the live lessons in
its scope and their tokens, the acting adapter's drift from the base model; for the round each top-level phase's wall
seconds, the process's resident memory and its peak so far, and the adapter that acted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

PHASES = ("PLAY", "EXTRACT", "CONSOLIDATE", "ASSESS")


@dataclass
class RoundRecord:
    after_phase: int
    label: str
    rates: dict[str, float | None]  # env -> held-out success after this round
    lessons: dict[str, dict[str, int]] = field(default_factory=dict)  # env -> {"count", "tokens"} in its prompt
    drift: dict[str, float] = field(default_factory=dict)  # env -> mean KL(acting || base) on the probe set
    seconds: dict[str, float] = field(default_factory=dict)  # top-level phase -> wall seconds this round
    rss_mb: float | None = None
    peak_rss_mb: float | None = None
    adapter: str | None = None

    def stored(self) -> dict:
        """What the assessment's rows keep (the rates are the rows themselves)."""
        return {
            "lessons": self.lessons,
            "drift": self.drift,
            "seconds": self.seconds,
            "rss_mb": self.rss_mb,
            "peak_rss_mb": self.peak_rss_mb,
            "adapter": self.adapter,
        }

    def line(self, envs: list[str], escape=str) -> str:
        """One line: the round, the matrix row, lessons (count/tokens), drift, and time per phase."""

        def short(env: str) -> str:
            return escape(env.rsplit("/", 1)[-1])

        row = " ".join(f"{short(e)} {'-' if self.rates.get(e) is None else f'{self.rates[e]:.0%}'}" for e in envs)
        lessons = " ".join(
            f"{short(e)} {self.lessons[e]['count']}/{self.lessons[e]['tokens']}t" for e in envs if e in self.lessons
        )
        drift = " ".join(f"{short(e)} {self.drift[e]:.3f}" for e in envs if e in self.drift)
        seconds = " ".join(f"{name} {self.seconds[name]:.0f}s" for name in PHASES if name in self.seconds)
        parts = [f"round {self.after_phase} ({escape(self.label)}): {row}"]
        if lessons:
            parts.append(f"lessons {lessons}")
        if drift:
            parts.append(f"drift {drift}")
        if seconds:
            parts.append(seconds)
        if self.rss_mb is not None:
            parts.append(f"rss {self.rss_mb:.0f} MB (peak {self.peak_rss_mb or self.rss_mb:.0f})")
        return " | ".join(parts)


def fill_round(record: RoundRecord, stored: dict) -> None:
    """Copy into `record` what a stored record holds of each field, skipping what is not of its type."""

    def numbers(value) -> dict:
        if not isinstance(value, dict):
            return {}
        return {k: float(v) for k, v in value.items() if isinstance(k, str) and isinstance(v, int | float)}

    lessons = stored.get("lessons")
    for env, entry in lessons.items() if isinstance(lessons, dict) else ():
        if isinstance(entry, dict) and all(isinstance(entry.get(k), int) for k in ("count", "tokens")):
            record.lessons[env] = {"count": entry["count"], "tokens": entry["tokens"]}
    record.drift.update(numbers(stored.get("drift")))
    record.seconds.update(numbers(stored.get("seconds")))
    for name in ("rss_mb", "peak_rss_mb"):
        if isinstance(stored.get(name), int | float):
            setattr(record, name, float(stored[name]))
    if isinstance(stored.get("adapter"), str):
        record.adapter = stored["adapter"]


@dataclass(frozen=True)
class FamilyCourse:
    """One family over the rounds: its base (row 0), best, end, the largest drop below its best so far at any
    round and at the end, and the lowest rate below its base after the phase that first trained it."""

    env: str
    base: float | None
    best: float | None
    end: float | None
    largest_drop_below_best: float  # >= 0, points as a fraction
    drop_below_best_at_end: float  # >= 0
    worst_below_base_after_learned: float | None  # min over rounds >= learned of R - base (negative: below)


def family_course(env: str, rates: Sequence[float | None], learned: int | None) -> FamilyCourse:
    """`rates`: the family's held-out success after each row (None: not assessed); `learned`: the first row whose
    phase trained it (None: never trained)."""
    seen = [(i, r) for i, r in enumerate(rates) if r is not None]
    if not seen:
        return FamilyCourse(env, None, None, None, 0.0, 0.0, None)
    best, largest = -1.0, 0.0
    for _, r in seen:
        best = max(best, r)
        largest = max(largest, best - r)
    base = rates[0] if rates else None
    after = [r for i, r in seen if learned is not None and i >= learned]
    below = min(r - base for r in after) if after and base is not None else None
    end = seen[-1][1]
    return FamilyCourse(env, base, best, end, largest, best - end, below)
