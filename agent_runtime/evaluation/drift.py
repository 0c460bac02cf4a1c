"""How far the acting policy has moved from the base model: per environment, the mean KL of its choice distribution
to the base model's on a fixed probe set.

A long-lived run stacks cycle on cycle, each adapter the parent of the next; published work reports that repeated
context distillation can drift away and collapse. Success on held-out games says when it already has; the drift says
how far the weights have gone on decisions that do not move, so that a slow slide is visible before it costs games.

The probe set: the first decision of the first `PROBE_GAMES` held-out games of every environment of the run, reset
with their evaluation seeds, in the prompt the agent would see without lessons. The openings do not depend on the
policy, so every round measures the same prompts. The held-out games are the right fold: the drift is reported,
never read by a decision. Only choice-mode decisions are probed (a distribution over the same action set under
both policies is exact); an environment played in free text has no drift figure.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from agent_runtime.episode.build import build_prompt_builders
from agent_runtime.episode.runner import _kept
from agent_runtime.evaluation.evaluator import env_pool
from agent_runtime.llm.base import ChoiceBackend, SamplingParams, acting

PROBE_GAMES = 8
_CHOOSE = SamplingParams(max_new_tokens=8, temperature=0.0, seed=0)


@dataclass(frozen=True)
class ProbePrompt:
    env_id: str
    task_id: str
    chat: list[dict]
    choices: list[str]


def probe_prompts(run, backend, games: int = PROBE_GAMES) -> list[ProbePrompt]:
    """The first decision of the first `games` held-out games of every environment, without lessons (choice-mode
    environments only)."""
    config = run.config
    pool = env_pool()
    specs, task_lists, keys = pool.envs(config, run.workdir, "eval")
    builders = build_prompt_builders(config, specs, backend)
    out = []
    for spec, tasks, key, builder in zip(specs, task_lists, keys, builders):
        if builder.action_mode != "choice":
            continue
        env = pool.borrow(key, spec.factory)
        healthy = False
        try:
            for i, task in enumerate(tasks[:games]):
                observation, info, _ = _kept(*env.reset(seed=config.evaluation.seed + i, task_id=task))
                choices = builder.choices(info.get("admissible_actions"))
                if choices:
                    out.append(
                        ProbePrompt(spec.env_id, task, builder.build([], observation, choices, lessons=[]), choices)
                    )
            healthy = True
        finally:
            if healthy:
                pool.give_back(key, env)
            else:
                with contextlib.suppress(Exception):
                    env.close()
    return out


def choice_kl(p_logprobs: list[float], q_logprobs: list[float]) -> float:
    """KL(p || q) in nats between two distributions over the same actions, given as log-probabilities."""
    assert len(p_logprobs) == len(q_logprobs), "two distributions over the same action set"
    return max(0.0, sum(math.exp(p) * (p - q) for p, q in zip(p_logprobs, q_logprobs) if p > -math.inf))


def drift(run, backend, adapter, prompts: list[ProbePrompt] | None = None) -> dict[str, float]:
    """{env id: mean KL(policy with `adapter` || base model)} over the probe set; {} when the backend cannot report
    a choice distribution. With no adapter the policy is the base model and every figure is 0."""
    if not isinstance(backend, ChoiceBackend):
        return {}
    prompts = probe_prompts(run, backend) if prompts is None else prompts
    if not prompts:
        return {}
    if adapter is None:
        return {env: 0.0 for env in dict.fromkeys(p.env_id for p in prompts)}
    chats, choices = [p.chat for p in prompts], [p.choices for p in prompts]
    with acting(backend, None):
        base = backend.choose(chats, choices, _CHOOSE)
    with acting(backend, adapter):
        now = backend.choose(chats, choices, _CHOOSE)
    per_env: dict[str, list[float]] = {}
    for prompt, b, n in zip(prompts, base, now):
        if b.choice_logprobs is None or n.choice_logprobs is None:
            return {}
        per_env.setdefault(prompt.env_id, []).append(choice_kl(list(n.choice_logprobs), list(b.choice_logprobs)))
    return {env: sum(values) / len(values) for env, values in per_env.items()}
