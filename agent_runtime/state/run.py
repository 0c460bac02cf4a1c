"""`Run`: one run as its phases see it, built once by whoever runs them (the loop, `agent-runtime distill`, a Ray
learner) and passed down instead of the four values every phase needs.

It holds the run's config, workdir, store and id, and what is derived from them once: the held-out task set
(`agent_runtime.evaluation.heldout`) and the pool its environments are built into and lent from (`EnvPool`: specs,
task lists and started game instances kept between a cycle's 5-9 evaluations and the gate's; by default the
process's pool). The phases take a `Run` and the backend they act with and play their evaluations through
`Run.evaluate`; they import nothing of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from agent_runtime.checkpoints import resolve_model
from agent_runtime.config import EnvEntry, RunConfig
from agent_runtime.evaluation import EnvPool, EvalResult, env_pool, evaluate
from agent_runtime.evaluation.heldout import HeldOut, held_out
from memory import ExperienceStore


@dataclass
class Run:
    config: RunConfig
    workdir: Path
    store: ExperienceStore
    id: int
    pool: EnvPool = field(default_factory=env_pool)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)

    @cached_property
    def held(self) -> HeldOut:
        """The held-out evaluation tasks, by task id and first observation (kept out of every learning input)."""
        return held_out(self.config, self.workdir)

    @cached_property
    def model_path(self) -> str:
        """What the run's model name resolves to (`resolve_model`), once per run: a cycle's trainer, its teacher
        check and the adapter probe all load this."""
        return resolve_model(self.config.model.name)

    @cached_property
    def families(self) -> dict[str, str]:
        """Each environment's prompt family by id (what a `family:NAME` lesson scope names)."""
        specs, _, _ = self.pool.envs(self.config, self.workdir, "train")
        return {spec.env_id: spec.family for spec in specs}

    def played_envs(self) -> list[str]:
        """The environments of the run it has played an episode of (a cycle's no-regression check covers each)."""
        return [e.id for e in self.config.envs if self.store.episodes(self.id, env_id=e.id, limit=1)]

    def evaluate(self, backend, *, envs: list[EnvEntry] | None = None, **kwargs) -> list[EvalResult]:
        """`agent_runtime.evaluation.evaluate` on this run's environments (or `envs` instead), from its pool."""
        if envs is not None:  # entries or their dicts, validated as the config's own
            envs = [EnvEntry.model_validate(e, from_attributes=True) for e in envs]
        config = self.config if envs is None else self.config.model_copy(update={"envs": envs})
        return evaluate(config, self.workdir, backend, pool=self.pool, **kwargs)
