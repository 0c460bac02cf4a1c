"""The learning page's view of a curriculum run's rounds (`ContinualView`): its continual-learning matrix R[i][j]
(held-out success on environment j after phase i) and each environment's curve over the phases, read from the assessment rows the loop stores (evaluation rows whose
`metrics.continual.after_phase` names the row; `agent_runtime.evaluation.matrix` writes them).

A row whose indexed fields break what `assess` writes (`memory.evaluation_metrics`: a phase beyond the run's
curriculum, one that is not a number, games that are not games) gives a view holding only `problem`, the message
naming that row and field, which the page shows in place of the matrix: never an error page, never a matrix of as
many rows as a bad phase number says.

Beside the matrix, a long-lived run's rounds (`memory.rounds`): each family's course (base, best, end, its largest
drop below its best so far, its lowest against its base once a phase has trained it) and each round's record (the
adapter that acted, the live lessons and their tokens per family, the drift from the base model, each phase's time
and the memory), read from the same rows.

The curves are drawn here as an inline SVG (one polyline per environment, x = the phase, y = success): a handful of
points, no script needed, and nothing stored is interpolated into markup except through the template's escaping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memory import ExperienceStore
from memory.evaluation_metrics import curriculum_phases, evaluation_problem
from memory.intervals import wilson_interval
from memory.rounds import PHASES, FamilyCourse, RoundRecord, family_course, fill_round

WIDTH, HEIGHT, PAD = 520, 200, 30
TICK = 60  # the width one row's label needs: a long run's curve widens rather than crowd its labels
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass
class Cell:
    rate: float
    low: float
    high: float
    n: int


@dataclass
class ContinualView:
    labels: list[str]  # row i's label: "start", then each phase's
    envs: list[str]
    cells: dict[tuple[int, str], Cell] = field(default_factory=dict)
    problem: str | None = None  # a stored row the matrix cannot be read with, named
    rounds: list[RoundRecord] = field(default_factory=list)  # the rounds that stored a record, in order
    learned: dict[str, int] = field(default_factory=dict)  # env -> the first row whose phase trained it
    phases: tuple[str, ...] = PHASES

    def cell(self, row: int, env: str) -> Cell | None:
        return self.cells.get((row, env))

    @property
    def width(self) -> int:
        return max(WIDTH, 2 * PAD + TICK * (len(self.labels) - 1))

    def courses(self) -> list[FamilyCourse]:
        return [
            family_course(
                env,
                [c.rate if (c := self.cell(i, env)) else None for i in range(len(self.labels))],
                self.learned.get(env),
            )
            for env in self.envs
        ]

    def curves(self) -> list[dict]:
        """Per environment: its colour, name and the SVG points of its success after each row it has."""
        rows, width = max(len(self.labels) - 1, 1), self.width
        out = []
        for k, env in enumerate(self.envs):
            points = [
                (PAD + (width - 2 * PAD) * i / rows, HEIGHT - PAD - (HEIGHT - 2 * PAD) * c.rate)
                for i in range(len(self.labels))
                if (c := self.cell(i, env)) is not None
            ]
            out.append(
                {
                    "env": env,
                    "colour": COLOURS[k % len(COLOURS)],
                    "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in points),
                    "dots": points,
                }
            )
        return out

    def ticks(self) -> list[tuple[float, str]]:
        rows, width = max(len(self.labels) - 1, 1), self.width
        return [(PAD + (width - 2 * PAD) * i / rows, label) for i, label in enumerate(self.labels)]


def continual_view(store: ExperienceStore, run_id: int) -> ContinualView | None:
    """The run's assessments as a matrix, or None when it has none (a run without a curriculum)."""
    rows = [e for e in store.evaluations(run_id, kind="eval") if "continual" in (e.metrics or {})]
    if not rows:
        return None
    config = store.get_run(run_id).config
    phases = curriculum_phases(config)
    for row in rows:
        problem = evaluation_problem(row.num_episodes, row.metrics, phases)
        if problem:
            return ContinualView([], [], problem=f"evaluation {row.id} ({row.env_id}): {problem}")
    labels: dict[int, str] = {}
    envs: list[str] = []
    view = ContinualView([], [])
    records: dict[int, RoundRecord] = {}
    for row in rows:
        mark = row.metrics["continual"]
        index = mark["after_phase"]
        labels[index] = str(mark.get("label") or index)
        if row.env_id not in envs:
            envs.append(row.env_id)
        wins = sum(1 for e in row.metrics.get("episodes", []) if e.get("won"))
        n = row.num_episodes or len(row.metrics.get("episodes", []))
        low, high = wilson_interval(wins, n)
        view.cells[(index, row.env_id)] = Cell(wins / n if n else 0.0, low, high, n)
        if isinstance(mark.get("round"), dict) and index not in records:
            records[index] = RoundRecord(index, labels[index], {})
            fill_round(records[index], mark["round"])
    view.labels = [labels.get(i, str(i)) for i in range(max(labels) + 1)]
    view.envs = envs
    view.rounds = [records[i] for i in sorted(records) if records[i].lessons or records[i].drift or records[i].seconds]
    view.learned = _learned(config, envs)
    return view


def _learned(config, envs: list[str]) -> dict[str, int]:
    """env -> the first row (1-based phase) of the stored curriculum whose phase plays it; a config that is not the
    shape the runtime writes gives none (the courses then have no figure against the base)."""
    phases = ((config or {}).get("curriculum") or {}).get("phases") if isinstance(config, dict) else None
    out: dict[str, int] = {}
    for i, phase in enumerate(phases if isinstance(phases, list) else [], start=1):
        played = phase.get("envs") if isinstance(phase, dict) else None
        for env in played if isinstance(played, list) else []:
            if env in envs:
                out.setdefault(env, i)
    return out
