"""The continual-learning matrix: how every environment is played after each phase of a curriculum.

R[i][j] is the success on environment j's held-out games after phase i (row 0: the agent as the run started, before
any phase; `agent_runtime.curriculum`). Every cell plays the same tasks with the same seeds, acting as the agent
acts then (its adapter, the live lessons in the environment's scope), so any two cells of a column pair game by
game. From the matrix (Lopez-Paz and Ranzato, "Gradient Episodic Memory", 2017), with learned(j) the first phase
that trains environment j and T the last phase:
- ACC = mean_j R[T][j]: how well everything is played at the end;
- BWT = mean over j with learned(j) < T of R[T][j] - R[learned(j)][j]: what later phases did to earlier learning
  (negative: forgetting);
- FWT = mean over j with learned(j) > 1 of R[learned(j) - 1][j] - R[0][j]: what earlier phases did for an
  environment before it was trained;
- each environment's worst drop after it was learned: min over i > learned(j) of R[i][j] - R[learned(j)][j].
Intervals are 95% percentile intervals of a paired bootstrap over each environment's games (2,000 resamples, seeded):
one run's uncertainty from its finite games; `bench/continual.py` adds the spread over seeds.

What: `assess(run, backend, after_phase, adapter=)` plays and stores one row (evaluation rows of kind eval, one per
environment, `metrics.continual.after_phase`); `load_matrix(store, run_id)`; `Matrix` (`acc`, `bwt`, `fwt`,
`drops`, `table`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent_runtime.curriculum import CurriculumConfig
from agent_runtime.terminal import shown
from distill.lessons import live_lessons
from distill.lessons.scope import scoped_lessons
from memory import AdapterInfo, ExperienceStore
from memory.errors import StoredRowError
from memory.evaluation_metrics import evaluation_problem
from memory.intervals import wilson_interval

RESAMPLES = 2000
Interval = tuple[float, float]


@dataclass
class Matrix:
    phases: list[str]  # row labels: "start", then each phase's
    envs: list[str]
    learned: dict[str, int]  # env -> the first phase (1-based row) that trains it; absent: never trained
    cells: dict[tuple[int, str], list[bool]] = field(default_factory=dict)  # (row, env) -> won per game, in order

    @property
    def rows(self) -> int:
        return 1 + max((i for i, _ in self.cells), default=-1)

    def rate(self, row: int, env: str) -> float | None:
        games = self.cells.get((row, env))
        return sum(games) / len(games) if games else None

    def complete(self) -> bool:
        return self.rows == len(self.phases) and all((i, e) in self.cells for i in range(self.rows) for e in self.envs)

    # -- the statistics, as functions of the cells so that the bootstrap can recompute them --------------------
    def _acc(self, cells) -> float | None:
        last = self.rows - 1
        values = [_mean(cells[(last, e)]) for e in self.envs if (last, e) in cells]
        return sum(values) / len(values) if values else None

    def _bwt(self, cells) -> float | None:
        last = self.rows - 1
        diffs = [
            _mean(cells[(last, e)]) - _mean(cells[(j, e)])
            for e, j in self.learned.items()
            if j < last and (last, e) in cells and (j, e) in cells
        ]
        return sum(diffs) / len(diffs) if diffs else None

    def _fwt(self, cells) -> float | None:
        diffs = [
            _mean(cells[(j - 1, e)]) - _mean(cells[(0, e)])
            for e, j in self.learned.items()
            if j > 1 and (j - 1, e) in cells and (0, e) in cells
        ]
        return sum(diffs) / len(diffs) if diffs else None

    def _interval(self, statistic: Callable[[dict], float | None]) -> tuple[float | None, Interval | None]:
        point = statistic(self.cells)
        if point is None:
            return None, None
        rng = random.Random(0)
        by_env: dict[str, int] = {}
        for (_, env), games in self.cells.items():
            by_env[env] = min(by_env.get(env, len(games)), len(games))
        values = []
        for _ in range(RESAMPLES):
            picks = {env: [rng.randrange(n) for _ in range(n)] for env, n in by_env.items() if n}
            resampled = {(i, e): [games[k] for k in picks[e]] for (i, e), games in self.cells.items() if e in picks}
            value = statistic(resampled)
            if value is not None:
                values.append(value)
        values.sort()
        return point, (values[int(0.025 * len(values))], values[min(len(values) - 1, int(0.975 * len(values)))])

    def acc(self) -> tuple[float | None, Interval | None]:
        return self._interval(self._acc)

    def bwt(self) -> tuple[float | None, Interval | None]:
        return self._interval(self._bwt)

    def fwt(self) -> tuple[float | None, Interval | None]:
        return self._interval(self._fwt)

    def drops(self) -> dict[str, float]:
        """Each learned environment's worst change after the phase that learned it (negative: a loss)."""
        out = {}
        for env, j in self.learned.items():
            after = [self.rate(i, env) for i in range(j + 1, self.rows)]
            base = self.rate(j, env)
            if base is not None and any(r is not None for r in after):
                out[env] = min(r for r in after if r is not None) - base
        return out

    def as_dict(self) -> dict:
        def stat(pair):
            point, interval = pair
            return {"value": point, "interval": list(interval) if interval else None}

        return {
            "phases": self.phases,
            "envs": self.envs,
            "learned": self.learned,
            "R": [[self.rate(i, e) for e in self.envs] for i in range(self.rows)],
            "games": {e: len(self.cells.get((0, e), [])) for e in self.envs},
            "acc": stat(self.acc()),
            "bwt": stat(self.bwt()),
            "fwt": stat(self.fwt()),
            "drops": self.drops(),
        }

    def table(self) -> str:
        """The matrix for a terminal; names from a config or a store are escaped (`agent_runtime.terminal.shown`)."""
        names = [shown(e.rsplit("/", 1)[-1]) for e in self.envs]
        width = max(len(n) for n in names) + 2
        labels = [("start" if i == 0 else f"after {i}: {shown(self.phases[i])}") for i in range(self.rows)]
        left = max(len(x) for x in labels) + 2
        games = max((len(g) for g in self.cells.values()), default=0)
        head = (
            f"Continual-learning matrix: held-out success after each phase ({games} games per environment, the same "
            "tasks and seeds in every row; * the phase that first trains it)"
        )
        lines = [
            head,
            " " * left + "".join(n.rjust(width) for n in names),
        ]
        for i, label in enumerate(labels):
            cells = []
            for e in self.envs:
                r = self.rate(i, e)
                mark = "*" if self.learned.get(e) == i else " "
                cells.append(("-" if r is None else f"{r:.0%}{mark}").rjust(width))
            lines.append(label.ljust(left) + "".join(cells))
        parts = []
        for name, (point, interval), unit, spec in (
            ("ACC", self.acc(), "%", ".1f"),  # an accuracy: no sign
            ("BWT", self.bwt(), " points", "+.1f"),  # differences: signed
            ("FWT", self.fwt(), " points", "+.1f"),
        ):
            if point is None:
                parts.append(f"{name} -")
                continue
            lo, hi = interval
            parts.append(f"{name} {point * 100:{spec}}{unit} [95% CI {lo * 100:{spec}} to {hi * 100:{spec}}]")
        lines.append("  ".join(parts))
        drops = self.drops()
        if drops:
            worst = min(drops, key=drops.get)
            lines.append(
                "worst change of a learned environment after later phases: "
                f"{shown(worst.rsplit('/', 1)[-1])} {drops[worst] * 100:+.1f} points"
            )
        return "\n".join(lines)


def _mean(games: Sequence[bool]) -> float:
    return sum(games) / len(games) if games else 0.0


def matrix_shape(curriculum: CurriculumConfig, env_ids: Sequence[str]) -> Matrix:
    learned: dict[str, int] = {}
    for i, phase in enumerate(curriculum.phases, start=1):
        for env in phase.envs:
            learned.setdefault(env, i)
    return Matrix(["start", *(p.label() for p in curriculum.phases)], list(env_ids), learned)


def load_matrix(store: ExperienceStore, run_id: int, curriculum: CurriculumConfig, env_ids: Sequence[str]) -> Matrix:
    """The run's stored assessments as a matrix (rows it has not reached yet are absent). A row whose indexed fields
    are not what `assess` writes (`memory.evaluation_metrics`: its phase within the curriculum, its games well formed) is a
    `StoredRowError` naming it and the field: such a row can only have been written around the store's checks."""
    matrix = matrix_shape(curriculum, env_ids)
    for row in store.evaluations(run_id, kind="eval"):
        if "continual" not in (row.metrics or {}) or row.env_id not in matrix.envs:
            continue
        problem = evaluation_problem(row.num_episodes, row.metrics, len(curriculum.phases))
        if problem:
            raise StoredRowError(
                f"evaluation {row.id} of run {run_id} ({row.env_id}): {problem}; the continual matrix is not read "
                "until that row is fixed or deleted"
            )
        episodes = sorted(row.metrics.get("episodes", []), key=lambda e: (e["seed"] is None, e["seed"] or 0))
        matrix.cells[(row.metrics["continual"]["after_phase"], row.env_id)] = [e["won"] for e in episodes]
    return matrix


def stored_matrix(store: ExperienceStore, run) -> Matrix | None:
    """A stored run's matrix from its stored config, or None for a run without a curriculum. A config that no
    longer reads is `ConfigError`, a bad assessment row `StoredRowError`."""
    from agent_runtime.config import config_from_dict

    config = config_from_dict(run.config, source=f"the stored config of run {run.id}", stored=True)
    if config.curriculum is None:
        return None
    return load_matrix(store, run.id, config.curriculum, [e.id for e in config.envs])


def assess(
    run, backend, after_phase: int, adapter: AdapterInfo | None = None, round_record: Callable[[], dict] | None = None
) -> list[int]:
    """Play every environment of the run on the curriculum's held-out games, acting as the agent acts now (the
    backend's adapter, the live lessons of the first pool in each environment's scope, fitted to the run's lesson
    budget as PLAY fits them: `Run.evaluate`), and store one evaluation
    row per environment marked with `after_phase`; returns their ids. The caller holds the transaction.
    `round_record`: called once the games are played, its dict kept beside the mark of every row (`rounds.RoundRecord`:
    lessons, drift, time and memory of the round)."""
    curriculum = run.config.curriculum
    assert curriculum is not None, "an assessment belongs to a curriculum"
    version, lessons = live_lessons(run.store, run.id)
    first = min((x.pool for x in lessons), default=0)
    shown = scoped_lessons(x for x in lessons if x.pool == first)
    results = run.evaluate(backend, lessons=shown, episodes_per_env=curriculum.eval_episodes)
    ids = []
    label = "start" if after_phase == 0 else curriculum.phases[after_phase - 1].label()
    mark = {"after_phase": after_phase, "label": label}
    if round_record is not None:
        mark["round"] = round_record()
    for result in results:
        lo, hi = wilson_interval(result.successes, result.n)
        ids.append(
            run.store.add_evaluation(
                result.env_id,
                run_id=run.id,
                adapter_id=adapter.id if adapter else None,
                lesson_set_version=version.version if version else None,
                split="eval",
                policy=run.config.model.name,
                num_episodes=result.n,
                success_rate=result.success_rate,
                mean_return=result.mean_return,
                metrics={
                    "continual": mark,
                    "episodes": result.episodes,
                    "interval": [lo, hi],
                },
            )
        )
    return ids
