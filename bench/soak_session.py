"""`Session`: the record of one `agent-runtime run` process of the soak, which bench/soak.py fills as it starts,
watches and kills the process, and bench/soak_report.py turns into the table (its own module, so that the two
never import each other).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Session:
    """One `agent-runtime run` process: how it was to end, how it ended, what was left after it."""

    index: int
    kind: str  # timer, phase, final
    delay: float
    resumed: bool
    start_episodes: int = 0
    end_episodes: int = 0
    seconds: float = 0.0
    killed: bool = False
    returncode: int | None = None
    phase_at_kill: str | None = None  # the cursor at the kill (CONSOLIDATE*: a cycle was running)
    peak_rss_kb: int = 0
    rss: list[tuple[float, int, int]] = field(default_factory=list)  # (seconds, VmRSS kB, episodes committed)
    tree_rss: list[tuple[float, int, int]] = field(default_factory=list)  # final: (seconds, kB, processes), all of it
    survivors: int = 0  # processes of the session alive 5 s after the kill
    running_cycles: list[int] = field(default_factory=list)  # cycle rows marked running after the kill
    db_bytes: int = 0
    violations: list[str] = field(default_factory=list)
