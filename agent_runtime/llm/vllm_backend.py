"""The `vllm` policy backend: GPU generation with vLLM, LoRA adapters hot-swapped without a restart.

vLLM is an optional extra (`pip install 'experiential-agent-runtime[gpu]'`) imported only when a config asks
for this backend; without it, or without a CUDA GPU, building the backend is a clear error. The engine is
started with `enable_lora=True`, so an adapter promoted by a consolidation cycle is served by registering a
new `LoRARequest` (`load_adapter`) and selecting it (`use_adapter`): the base weights stay loaded.

Prompts are rendered with the tokenizer's chat template here (the same text the transformers backend
renders), so both backends see identical prompts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agent_runtime.llm.base import (
    BackendError,
    BackendStats,
    Chat,
    Completion,
    SamplingParams,
    apply_stop,
    closest_action,
)


def import_vllm():
    try:
        import vllm
    except ImportError:
        raise BackendError(
            "the vllm backend needs vLLM, which is not installed: install the `gpu` extra "
            "(pip install 'experiential-agent-runtime[gpu]') on a machine with a CUDA GPU, or use backend: transformers"
        ) from None
    return vllm


class VLLMBackend:
    name = "vllm"

    def __init__(self, model_path: str, *, context_window: int | None = None, dtype: str = "auto",
                 max_lora_rank: int = 64, max_loras: int = 4, gpu_memory_utilization: float = 0.85,
                 seed: int = 0, **engine_kwargs: Any):
        vllm = import_vllm()
        import torch

        if not torch.cuda.is_available():
            raise BackendError("the vllm backend needs a CUDA GPU and none is available; use backend: transformers")
        self._vllm = vllm
        self.llm = vllm.LLM(model=model_path, dtype=dtype if dtype != "auto" else "auto", enable_lora=True,
                            max_lora_rank=max_lora_rank, max_loras=max_loras, seed=seed,
                            gpu_memory_utilization=gpu_memory_utilization,
                            max_model_len=context_window, **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._context_window = context_window or self.llm.llm_engine.model_config.max_model_len
        self.adapters: dict[str, Any] = {}
        self.active_adapter: str | None = None
        self.stats = BackendStats()

    @property
    def context_window(self) -> int:
        return self._context_window

    def render(self, chat: Chat) -> str:
        return self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)

    def count_tokens(self, chat: Chat) -> int:
        return len(self.tokenizer(self.render(chat), add_special_tokens=False)["input_ids"])

    def load_adapter(self, name: str, path: str | Path) -> None:
        from vllm.lora.request import LoRARequest

        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"no LoRA adapter at {str(path)!r} (adapter_config.json missing)")
        self.adapters[name] = LoRARequest(name, len(self.adapters) + 1, str(path))
        self.use_adapter(name)

    def use_adapter(self, name: str | None) -> None:
        if name is not None and name not in self.adapters:
            raise BackendError(f"unknown adapter {name!r}; loaded: {', '.join(self.adapters) or 'none'}")
        self.active_adapter = name

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Completion]:
        start = time.perf_counter()
        texts = [self.render(chat) for chat in prompts]
        sampling = self._vllm.SamplingParams(
            n=1, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None, logprobs=0 if params.logprobs else None, seed=params.seed)
        lora = self.adapters.get(self.active_adapter) if self.active_adapter else None
        outputs = self.llm.generate(texts, sampling, lora_request=lora, use_tqdm=False)
        elapsed = time.perf_counter() - start
        out = []
        for text, result in zip(texts, outputs):
            gen = result.outputs[0]
            logprobs = None
            if params.logprobs and gen.logprobs is not None:
                logprobs = [step[tok].logprob for step, tok in zip(gen.logprobs, gen.token_ids)]
            reply, stopped = apply_stop(gen.text, params.stop)
            out.append(Completion(
                text=reply, token_ids=list(gen.token_ids), prompt_tokens=len(result.prompt_token_ids),
                finish_reason="length" if gen.finish_reason == "length" and not stopped else "stop",
                logprobs=logprobs, prompt_text=text, latency_s=elapsed,
            ))
        self.stats.record(out, elapsed)
        return out

    def choose(self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams) -> list[Completion]:
        """Choice mode through vLLM's structured outputs: decoding constrained to the set's strings (token by
        token over the trie of the actions, so the draw follows vLLM's per-token renormalised distribution,
        not the softmax of whole-sequence log-probabilities the transformers backend uses). Only the chosen
        action is known, so `choice_logprobs` stays None."""
        start = time.perf_counter()
        texts = [self.render(chat) for chat in prompts]
        lora = self.adapters.get(self.active_adapter) if self.active_adapter else None
        sampling = [self._vllm.SamplingParams(n=1, temperature=params.temperature, top_p=params.top_p,
                                              max_tokens=params.max_new_tokens, seed=params.seed, logprobs=0,
                                              **self._choice_kwargs(options)) for options in choices]
        outputs = self.llm.generate(texts, sampling, lora_request=lora, use_tqdm=False)
        elapsed = time.perf_counter() - start
        out = []
        for text, result, options in zip(texts, outputs, choices):
            gen = result.outputs[0]
            logprob = None
            if gen.logprobs is not None:
                logprob = [sum(step[tok].logprob for step, tok in zip(gen.logprobs, gen.token_ids))]
            out.append(Completion(
                text=closest_action(gen.text, options), token_ids=list(gen.token_ids),
                prompt_tokens=len(result.prompt_token_ids), logprobs=logprob, prompt_text=text, latency_s=elapsed))
        self.stats.record(out, elapsed)
        return out

    def _choice_kwargs(self, options: list[str]) -> dict[str, Any]:
        """The constraint in the installed vLLM's words (`structured_outputs` now, `guided_decoding` before)."""
        from vllm import sampling_params as sp

        if hasattr(sp, "StructuredOutputsParams"):
            return {"structured_outputs": sp.StructuredOutputsParams(choice=list(options))}
        return {"guided_decoding": sp.GuidedDecodingParams(choice=list(options))}

    def close(self) -> None:
        self.llm = None
