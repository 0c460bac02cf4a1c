"""A run whose environments arrive over time: the `curriculum:` section of a run config, and its arithmetic.

A long-lived agent lives many environments one after another. The curriculum names them in phases, each a number of
episodes played only in its environments (drawn from `envs` by their weights), for example coin-collector, then
treasure-hunter, then coin-collector again:

    envs: [{id: textworld/coin_collector}, {id: textworld/treasure_hunter}, {id: arena/frozen_lake}]
    curriculum:
      eval_episodes: 20
      phases:
        - {envs: [textworld/coin_collector], episodes: 32}
        - {envs: [textworld/treasure_hunter], episodes: 32}
        - {envs: [arena/frozen_lake], episodes: 32}

Each phase ends with its EXTRACT and CONSOLIDATE (they are due at a phase's end whatever `extract_every` and
`consolidate_every` say), then an assessment: every environment of the run on `eval_episodes` held-out games with
fixed seeds, acting as the agent acts (its adapter, the live lessons in each environment's scope). Before the first
phase the same assessment measures the agent as it starts. Those rows are the continual-learning matrix
(`agent_runtime.evaluation.matrix`): R[i][j], success on environment j after phase i.

Phase i owns draw indices [start_i, end_i): which environment a draw plays is a pure function of its index, as every
draw is, so a run killed mid-phase resumes into the same phase with the same draws.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from modelkit.config_base import StrictConfig


class CurriculumPhase(StrictConfig):
    """One phase: the environments it plays (ids from `envs`) and how many episodes."""

    envs: list[str] = Field(..., min_length=1, description="environment ids of the run's `envs`")
    episodes: int = Field(..., gt=0, description="episodes played in this phase")
    name: str | None = Field(None, max_length=80, description="a label for tables (default: its environments)")

    def label(self) -> str:
        return self.name or "+".join(e.rsplit("/", 1)[-1] for e in self.envs)


class CurriculumConfig(StrictConfig):
    """Environments arriving over time, and the assessment after each phase (see the module docstring)."""

    phases: list[CurriculumPhase] = Field(..., min_length=1)
    eval_episodes: int = Field(20, gt=0, description="held-out games per environment in each assessment")

    def ends(self) -> list[int]:
        """The episode count at which each phase ends."""
        out, total = [], 0
        for phase in self.phases:
            total += phase.episodes
            out.append(total)
        return out

    @property
    def episodes(self) -> int:
        return self.ends()[-1]

    def phase_of(self, index: int) -> int:
        """The phase that draw `index` (0-based) belongs to; past the last phase, the last."""
        for i, end in enumerate(self.ends()):
            if index < end:
                return i
        return len(self.phases) - 1

    def boundary(self, episodes: int) -> int:
        """The end of the newest phase finished at `episodes` episodes (0: none yet)."""
        return max([end for end in self.ends() if end <= episodes], default=0)

    def finished(self, episodes: int) -> int:
        """How many phases are finished at `episodes` episodes."""
        return sum(1 for end in self.ends() if end <= episodes)

    def weights(self, env_ids: Sequence[str], base: Sequence[float], index: int) -> list[float]:
        """The draw weights of draw `index`: the run's own for the phase's environments, 0 for the others."""
        active = set(self.phases[self.phase_of(index)].envs)
        return [w if e in active else 0.0 for e, w in zip(env_ids, base)]

    def plays(self, env_ids: Sequence[str], index: int) -> set[int]:
        """The positions in `env_ids` of the environments draw `index`'s phase plays."""
        active = set(self.phases[self.phase_of(index)].envs)
        return {i for i, env_id in enumerate(env_ids) if env_id in active}

    def unknown(self, env_ids: Sequence[str]) -> list[str]:
        """Phase environments that are not among `env_ids`."""
        return sorted({e for p in self.phases for e in p.envs} - set(env_ids))
