"""Where a run's time goes: wall and CPU seconds per phase, and the tokens each phase put through the model.

The loop keeps one `Profile` (`AgentLoop.profile`) and measures what it runs: START (building the environments,
and the model as its own row), PLAY, EXTRACT, CONSOLIDATE, PROMOTE: probe; code deeper down marks its own
parts with `profiled(name)` (a cycle's training and its evaluations), which counts only while a profile is
active in this process and is free otherwise. A part is measured inside its phase, so a phase's row includes
its parts. Every row also says how many games it generated and how long that took (games are generated when
first needed, through `environments.game_cache`).

Tokens come from the acting backend's counters (`BackendStats`: prompt tokens scored, tokens generated,
decisions) for the acting parts, and from `count_work` for work outside it, added to every open row: a cycle's
training (the trainer's totals: the tokens the student ran forward and backward, those the frozen teacher ran
forward, and those the student ran forward without gradients for the held-out KL) and the probe's own model.
`bench/loop.py` turns them into each phase's *floor*, the time a plain batched forward (and forward+backward) of
the same tokens takes on the same machine.

Memory: every row keeps the process's peak resident set during the phase (`peak_rss_mb`) and what was resident
when it ended (`end_rss_mb`). The peak is the kernel's high-water mark (VmHWM), which the profile resets at every
phase boundary (`/proc/self/clear_refs`), folding the mark into every open row first, so a phase's peak is its
own and an enclosing phase's is the largest of its parts'. Where the mark cannot be reset (not Linux), rows
report the process's peak so far, `peak_is_phase` False.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

_ACTIVE: list[Profile] = []


@dataclass
class PhaseTime:
    wall_s: float = 0.0
    cpu_s: float = 0.0
    times: int = 0
    prompt_tokens: int = 0  # forward only: the acting policy's prompts (and scored action tokens' prompts)
    generated_tokens: int = 0
    decisions: int = 0  # completions the backend returned (choice mode: scored action sets)
    train_tokens: int = 0  # forward + backward through the student
    teacher_tokens: int = 0  # forward only, through the frozen teacher
    scored_tokens: int = 0  # forward only, through the student without gradients (a cycle's held-out KL)
    games: int = 0  # games generated (not found in the game cache) during the phase
    games_s: float = 0.0  # the wall seconds that took
    prefilled_tokens: int = 0  # acting prompt tokens run through the model at all (what the prefix store left)
    peak_rss_mb: float = 0.0  # the largest resident set during the phase (any of its times)
    end_rss_mb: float = 0.0  # resident when it last ended

    @property
    def forward_tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens + self.teacher_tokens + self.scored_tokens

    def count(
        self,
        prompt_tokens: int = 0,
        generated_tokens: int = 0,
        decisions: int = 0,
        train_tokens: int = 0,
        teacher_tokens: int = 0,
        scored_tokens: int = 0,
    ) -> None:
        """Add work that ran outside the acting backend: forward work (the probe's own reference model) and a
        cycle's training."""
        self.prompt_tokens += prompt_tokens
        self.generated_tokens += generated_tokens
        self.decisions += decisions
        self.train_tokens += train_tokens
        self.teacher_tokens += teacher_tokens
        self.scored_tokens += scored_tokens


class Profile:
    """Per-phase totals of one process's run. `stats()` gives the acting backend's counters, `prefix()` its prefix KV
    store's (`PrefixCacheStats`; None: none yet, or a backend without a store)."""

    def __init__(
        self, stats: Callable[[], object | None] = lambda: None, prefix: Callable[[], object | None] = lambda: None
    ):
        self._stats, self._prefix = stats, prefix
        self.phases: dict[str, PhaseTime] = {}
        self._open: list[PhaseTime] = []
        self.peak_is_phase = reset_peak()

    def _counters(self) -> tuple[int, int, int, int, float, int]:
        from environments.game_cache import BUILT

        stats, prefix = self._stats(), self._prefix()
        acting = (0, 0, 0) if stats is None else (stats.prompt_tokens, stats.completion_tokens, stats.completions)
        return (*acting, BUILT["games"], BUILT["seconds"], 0 if prefix is None else prefix.prefilled_tokens)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[PhaseTime]:
        row = self.phases.setdefault(name, PhaseTime())
        self._fold_peak()
        wall, cpu, counters = time.perf_counter(), time.process_time(), self._counters()
        _ACTIVE.append(self)
        self._open.append(row)
        try:
            yield row
        finally:
            _ACTIVE.remove(self)
            self._fold_peak()
            # by identity: rows are dataclasses, and two rows with the same numbers compare equal
            del self._open[next(i for i, r in enumerate(self._open) if r is row)]
            row.end_rss_mb = memory_mb().get("VmRSS", 0.0)
            # read after the fold: what grew in between is the phase's too, so its peak is at least its end
            row.peak_rss_mb = max(row.peak_rss_mb, row.end_rss_mb)
            after = self._counters()
            row.wall_s += time.perf_counter() - wall
            row.cpu_s += time.process_time() - cpu
            row.times += 1
            row.prompt_tokens += after[0] - counters[0]
            row.generated_tokens += after[1] - counters[1]
            row.decisions += after[2] - counters[2]
            row.games += after[3] - counters[3]
            row.games_s += after[4] - counters[4]
            row.prefilled_tokens += after[5] - counters[5]

    def open_phases(self) -> list[str]:
        """The names of the phases running now, outermost first."""
        names = {id(row): name for name, row in self.phases.items()}
        return [names[id(row)] for row in self._open]

    def _fold_peak(self) -> None:
        """Fold the high-water mark since the last boundary into every open row, and start a new one."""
        peak = memory_mb().get("VmHWM", 0.0)
        for row in self._open:
            row.peak_rss_mb = max(row.peak_rss_mb, peak)
        if self.peak_is_phase:
            reset_peak()

    def count(self, **work: int) -> None:
        """Add work that ran outside the acting backend to every open row (`PhaseTime.count`): a phase's row
        includes its parts'."""
        for row in self._open:
            row.count(**work)

    def as_dict(self) -> dict[str, dict]:
        return {name: {**asdict(row), "forward_tokens": row.forward_tokens} for name, row in self.phases.items()}


def count_work(**work: int) -> None:
    """Tell the active profile (nothing when none is active) of work that ran outside the acting backend, in the
    names of `PhaseTime.count`; every open phase counts it."""
    if _ACTIVE:
        _ACTIVE[-1].count(**work)


@contextlib.contextmanager
def profiled(name: str) -> Iterator[PhaseTime | None]:
    """Measure a part of a phase under `name` in the active profile (nothing when none is active); yields its row
    (None without a profile). Work the acting backend does not count goes to `count_work`."""
    if not _ACTIVE:
        yield None
        return
    with _ACTIVE[-1].phase(name) as row:
        yield row


def memory_mb() -> dict[str, float]:
    """This process's VmRSS (resident now) and VmHWM (peak resident since the last reset), in MB; {} off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            lines = status.read().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def reset_peak() -> bool:
    """Reset this process's VmHWM to its resident set now (Linux: `clear_refs` 5); False where that is not possible."""
    try:
        fd = os.open("/proc/self/clear_refs", os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, b"5")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
