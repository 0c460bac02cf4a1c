"""The lesson gate's runtime side: the games a lesson set's trials play, and the gate run on them.

Every rule of which lessons go live, and where, is `distill.lessons`' (`golive` for a candidate set, per environment;
`selection` for induced lessons); this module plays the games those rules are given. `GameTrials` plays each
environment once per distinct set of its in-scope lessons: evaluation is greedy with fixed seeds, so a set already
played is not played again (the trials of induced lessons ask for the same sets often), and a lesson scoped to one
environment costs no games in the others. `play_gate` hands the gate's games (`lessons.gate_split`) to
`distill.lessons.golive.gate_candidate`, which decides and stores the decision.
"""

from __future__ import annotations

from agent_runtime.llm.base import PolicyBackend
from agent_runtime.state import Run
from distill.lessons import LessonCurator
from distill.lessons.golive import GateOutcome, gate_candidate
from distill.lessons.scope import ScopedLesson, for_env

Lessons = list[str | ScopedLesson]


class GameTrials:
    """Who won each game of a decision's fold (`split`: the gate's by default) with a set of lessons in context:
    {(env id, task id, seed): won}, what `decide_gate` pairs; every environment played at most once per distinct set
    of its in-scope lessons."""

    def __init__(self, run: Run, backend: PolicyBackend, split: str | None = None):
        self.run, self.backend = run, backend
        self.settings = run.config.lessons
        self.split = split or self.settings.gate_split  # the gate's fold; the induced lessons' search: trial_split
        self._played: dict[tuple[str, tuple[str, ...]], dict] = {}

    def _key(self, env_id: str, lessons: Lessons) -> tuple[str, tuple[str, ...]]:
        return env_id, tuple(for_env(lessons, env_id, self.run.families.get(env_id)))

    def __call__(self, lessons: Lessons, envs: list[str] | None = None) -> dict:
        entries = [e for e in self.run.config.envs if envs is None or e.id in envs]
        missing = [e for e in entries if self._key(e.id, lessons) not in self._played]
        if missing:
            results = self.run.evaluate(
                self.backend,
                envs=missing,
                lessons=lessons,
                episodes_per_env=self.settings.gate_episodes,
                split=self.split,
            )
            for result in results:
                self._played[self._key(result.env_id, lessons)] = {
                    (result.env_id, e["task_id"], e["seed"]): e["won"] for e in result.episodes
                }
        out: dict = {}
        for entry in entries:
            out.update(self._played[self._key(entry.id, lessons)])
        return out


def play_gate(run: Run, backend: PolicyBackend, curator: LessonCurator, candidate_version: int) -> GateOutcome:
    """Gate candidate `candidate_version` on the run's environments, its games played here (`GameTrials` on
    `lessons.gate_split`): `distill.lessons.golive.gate_candidate` decides where its lessons go live and stores it."""
    families = run.families
    envs = {e.id: families.get(e.id) for e in run.config.envs}
    trials = GameTrials(run, backend)
    return gate_candidate(
        run.store, run.id, curator, candidate_version, envs, trials, margin=run.config.lessons.gate_margin
    )
