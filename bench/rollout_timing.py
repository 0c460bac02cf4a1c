"""The timing wrappers of `bench/rollout.py`: where a setting's wall time went, with nothing in the runtime changed.

A setting's environments, prompt builder and backend are wrapped in thin delegates that add to one `Timers`:
`TimedEnv` the environments' `reset` + `step`, `TimedBuilder` prompt building (`PromptBuilder.build`),
`TimedBackend` `backend.generate` / `backend.choose` and, inside them, the model's own `generate` and its first
forward (the prompt's prefill), with the prompt batch's padding and the tokens each decision put through the
model. `cpu_seconds` is this process's CPU time, plus the vLLM engine's processes when a setting runs on them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agent_runtime.episode.prompt import PromptBuilder
from agent_runtime.llm.base import LocalModelBackend
from agent_runtime.llm.transformers_backend import TransformersBackend


@dataclass
class Timers:
    """Seconds spent in each part of a turn, summed over a setting."""

    model_generate: float = 0.0
    prefill: float = 0.0
    backend_generate: float = 0.0
    build: float = 0.0
    env: float = 0.0
    prompt_tokens: int = 0
    padded_tokens: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    # tokens through the model per decision (prompt tokens prefilled + action tokens scored), one list per
    # episode in the order episodes started: exact with one slot, where every call is one episode's decision
    episode_tokens: list[list[int]] = field(default_factory=list)


class TimedEnv:
    """Delegates to a real environment and adds the time of reset/step to the timers."""

    def __init__(self, env, timers: Timers):
        self._env, self._timers = env, timers
        self.spec = env.spec

    def reset(self, **kwargs):
        self._timers.episode_tokens.append([])
        start = time.perf_counter()
        try:
            return self._env.reset(**kwargs)
        finally:
            self._timers.env += time.perf_counter() - start

    def step(self, action):
        start = time.perf_counter()
        try:
            return self._env.step(action)
        finally:
            self._timers.env += time.perf_counter() - start

    def close(self):
        self._env.close()


class TimedBuilder:
    def __init__(self, builder: PromptBuilder, timers: Timers):
        self._builder, self._timers = builder, timers

    def __getattr__(self, name):  # everything but build (action_mode, choices, ...) is the builder's own
        return getattr(self._builder, name)

    def build(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._builder.build(*args, **kwargs)
        finally:
            self._timers.build += time.perf_counter() - start


class TimedBackend:
    """Times `backend.generate` and, inside it, the model's own `generate`; counts padding."""

    def __init__(self, backend: TransformersBackend, timers: Timers):
        self._backend, self._timers = backend, timers
        self.name = backend.name
        if not isinstance(backend, LocalModelBackend):  # the vllm backend: the engine is not ours to take apart
            return
        model_generate, model_forward = backend.model.generate, backend.model.forward
        calls = {"forward": 0}

        def timed_model_generate(*args, **kwargs):
            mask = kwargs.get("attention_mask")
            if mask is not None:
                timers.prompt_tokens += int(mask.sum())
                timers.padded_tokens += int(mask.numel() - mask.sum())
            calls["forward"] = 0
            start = time.perf_counter()
            try:
                return model_generate(*args, **kwargs)
            finally:
                timers.model_generate += time.perf_counter() - start

        def timed_forward(*args, **kwargs):
            calls["forward"] += 1
            if calls["forward"] > 1:
                return model_forward(*args, **kwargs)
            start = time.perf_counter()  # the first forward of a generate call is the prompt's prefill
            try:
                return model_forward(*args, **kwargs)
            finally:
                timers.prefill += time.perf_counter() - start

        # instance attributes shadow the methods; `restore` removes them again
        backend.model.generate, backend.model.forward = timed_model_generate, timed_forward

    def restore(self) -> None:
        if isinstance(self._backend, LocalModelBackend):
            for name in ("generate", "forward"):
                self._backend.model.__dict__.pop(name, None)

    @property
    def context_window(self) -> int:
        return self._backend.context_window

    def count_tokens(self, chat) -> int:
        return self._backend.count_tokens(chat)

    def generate(self, prompts, params):
        start = time.perf_counter()
        try:
            return self._backend.generate(prompts, params)
        finally:
            self._timers.backend_generate += time.perf_counter() - start
            self._timers.batch_sizes.append(len(prompts))

    def choose(self, prompts, choices, params):
        stats = getattr(self._backend, "prefix_stats", None)
        before = stats.prefilled_tokens + stats.scored_tokens if stats is not None else 0
        start = time.perf_counter()
        try:
            return self._backend.choose(prompts, choices, params)
        finally:
            self._timers.backend_generate += time.perf_counter() - start
            self._timers.batch_sizes.append(len(prompts))
            if stats is not None and self._timers.episode_tokens:
                self._timers.episode_tokens[-1].append(stats.prefilled_tokens + stats.scored_tokens - before)

    def close(self) -> None:
        self._backend.close()


def cpu_seconds(backend) -> float:
    """CPU time of this process, plus the vLLM engine's processes when there are any."""
    import psutil

    from agent_runtime.llm.vllm_process import VLLMProcessBackend

    total = time.process_time()
    if isinstance(backend, VLLMProcessBackend):
        parent = psutil.Process(backend.pid)
        for proc in [parent, *parent.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
    return total
