"""`RunState`: the run's persisted counters, what the run row's `state` column holds.

Counters only, nothing derived, so `run --resume` is exact without pickling anything: episodes committed, won and
failed, the next draw and the draws handed out but not committed (replayed on resume), the phases done and where they
last ran, a curriculum's assessments. A phase writes the state it leaves with its cursor move (`state.cursor`), in
the transaction of its own results; PLAY commits each episode with the state that counts it
(`agent_runtime.run.play.PlaySession`), and `Schedule` reads it to say what is due.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

from memory import EpisodeRecord


@dataclass
class RunState:
    """The run's persisted counters (the run row's `state`)."""

    episodes: int = 0  # committed episodes
    won: int = 0
    errors: int = 0
    next_draw: int = 0  # the first draw index never handed out
    open_draws: list[int] = field(default_factory=list)  # handed out, not committed: replayed on resume
    extractions: int = 0
    last_extract_at: int = 0  # episodes committed when the last EXTRACT ran
    cycles: int = 0
    last_consolidate_at: int = 0
    assessed: int = 0  # a curriculum's assessments done: the start's, then one per finished phase

    @classmethod
    def from_stored(cls, data: dict | None) -> RunState:
        """The state as stored by this or an earlier version (missing counters start at 0)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})

    def stored(self) -> dict:
        return asdict(self)

    def with_episode(self, record: EpisodeRecord, open_draws: list[int]) -> RunState:
        """The state once `record` is committed."""
        return replace(
            self,
            episodes=self.episodes + 1,
            won=self.won + int(record.won),
            errors=self.errors + int(record.outcome == "error"),
            open_draws=sorted(open_draws),
        )
