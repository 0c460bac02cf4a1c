"""Held-out evaluation: each environment's eval split, the same tasks and seeds every time.

Task i of an environment's eval split is always played with seed `evaluation.seed + i`, and decoding is
greedy by default, so two policies (an adapter against its parent, lessons in context against none) are
compared on identical games. Evaluation episodes are not written as experience (they must not leak into
lesson extraction or the OPCD prompt pool); each environment's result is stored as one evaluation row whose
metrics hold the per-episode outcomes, so a later comparison can pair them task by task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from agent_runtime.config import RunConfig
from agent_runtime.envs import build_envs, build_prompt_builders
from agent_runtime.llm.base import PolicyBackend, SamplingParams
from agent_runtime.runner import Draw, EpisodeRunner
from distill.lessons.gate import wilson_interval
from memory import EpisodeRecord


@dataclass
class EvalResult:
    env_id: str
    episodes: list[dict] = field(default_factory=list)  # task_id, seed, won, return, steps, outcome

    @property
    def n(self) -> int:
        return len(self.episodes)

    @property
    def successes(self) -> int:
        return sum(1 for e in self.episodes if e["won"])

    @property
    def success_rate(self) -> float:
        return self.successes / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.n)

    @property
    def mean_return(self) -> float:
        return sum(e["return"] for e in self.episodes) / self.n if self.n else 0.0

    def line(self) -> str:
        lo, hi = self.interval
        return (f"{self.env_id:<28} {self.successes:>4}/{self.n:<4} success {self.success_rate:6.1%} "
                f"[95% CI {lo:.1%}-{hi:.1%}]  mean return {self.mean_return:.2f}")


def evaluate(config: RunConfig, workdir: Path, backend: PolicyBackend, *, lessons: list[str] | None = None,
             episodes_per_env: int | None = None, slots: int | None = None, split: str = "eval",
             context: str | None = None) -> list[EvalResult]:
    """Play the first N tasks of `split` (the held-out eval split by default) of every environment of the
    config; return one result per environment. `context`: a system prompt appended to every system message
    (a system-prompt distillation cycle's "with context" conditions)."""
    n = episodes_per_env or config.evaluation.episodes_per_env
    specs, task_lists = build_envs(config, workdir, split=split)
    builders = build_prompt_builders(config, specs, backend, lessons, context)
    params = SamplingParams(max_new_tokens=config.model.max_new_tokens, temperature=config.evaluation.temperature,
                            top_p=config.model.top_p)
    queue = [Draw(index=len(specs) * i + e, env_index=e, task_id=tasks[i], seed=config.evaluation.seed + i)
             for e, tasks in enumerate(task_lists) for i in range(min(n, len(tasks)))]
    results = [EvalResult(spec.env_id) for spec in specs]

    def on_episode(record: EpisodeRecord) -> None:
        env_index = next(i for i, s in enumerate(specs) if s.env_id == record.env_id)
        results[env_index].episodes.append({
            "task_id": record.task_id, "seed": record.seed, "won": record.won, "return": record.total_return,
            "steps": len(record.steps), "outcome": record.outcome})

    torch.manual_seed(config.evaluation.seed)
    runner = EpisodeRunner(backend, specs, builders, params, slots=slots or config.runtime.slots,
                           policy_name=config.model.name)
    try:
        runner.run(lambda: queue.pop(0) if queue else None, on_episode)
    finally:
        runner.close()
    for result in results:
        result.episodes.sort(key=lambda e: e["seed"])
    return results
