"""The `transformers` policy backend: batched generation with a Hugging Face causal LM, CPU or CUDA.

Prompts are rendered with the tokenizer's chat template and left-padded into one batch (decoder-only models
continue from the right edge, so padding goes on the left), generated with the KV cache, and cut at the first
EOS or stop string. Sampling is seeded per call when `SamplingParams.seed` is set, so a run repeats.

LoRA adapters (peft) are loaded by name and switched with `use_adapter(name)`; `use_adapter(None)` gives the
base model. With `dtype: auto` the model runs in bf16 on CUDA and on CPUs with native bf16 support
(AVX512-BF16/AMX: measured 1.7x faster generation than fp32 for SmolLM2-135M on this kind of machine, see
bench/RESULTS.md), else in float32.

Shared-prefix KV cache: in the agent loop every slot's prompt starts with the same system prompt and lessons
block, and prefill is compute-bound on CPU. When all rows of a batch share a long enough token prefix, that
prefix is run once (its KV cache kept per prefix and adapter), repeated for every row, and the rows are laid
out as [prefix][left padding][rest of the prompt]; position ids come from the attention mask, so every row
sees the same positions as without the cache and greedy decoding gives the same tokens.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import OrderedDict
from pathlib import Path

import torch

from agent_runtime.llm.base import BackendError, BackendStats, Chat, Completion, SamplingParams, apply_stop

_PREFIX_CACHE_ENTRIES = 4
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """`cpu`, `cuda`, `cuda:N` or `auto`; CUDA asked for without a GPU is a clear error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} asked for, but no CUDA GPU is available here; use device: cpu or auto")
    try:
        return torch.device(device)
    except RuntimeError:
        raise BackendError(f"unknown device {device!r}; accepted: cpu, cuda, cuda:N, auto") from None


def auto_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16
    native_bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()
    return torch.bfloat16 if native_bf16 else torch.float32


class TransformersBackend:
    name = "transformers"

    def __init__(self, model, tokenizer, *, context_window: int | None = None, device: str = "cpu",
                 dtype: str = "auto", prefix_cache: bool = True, min_shared_prefix: int = 32):
        """Wrap an already loaded model and tokenizer (tests build tiny ones in code).

        `prefix_cache` turns the shared-prefix KV cache on; it is used only for batches of two or more rows
        that share at least `min_shared_prefix` prompt tokens.
        """
        self.device = resolve_device(device)
        torch_dtype = _DTYPES.get(dtype) or auto_dtype(self.device)
        self.model = model.to(device=self.device, dtype=torch_dtype).eval()
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        limit = getattr(model.config, "max_position_embeddings", None) or 2048
        self._context_window = min(context_window or limit, limit)
        self.adapters: dict[str, str] = {}
        self.active_adapter: str | None = None
        self.stats = BackendStats()
        self.prefix_cache = prefix_cache
        self.min_shared_prefix = min_shared_prefix
        self._prefix_kv: OrderedDict[tuple, object] = OrderedDict()  # (adapter, prefix ids) -> prefix KV cache

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kwargs) -> TransformersBackend:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            # offline by design: a Hugging Face id must already be in the local cache
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(name_or_path, local_files_only=True)
        except OSError as exc:
            raise BackendError(
                f"cannot load model {name_or_path!r} offline: {exc}. Give a local checkpoint path, a model already "
                "in the Hugging Face cache, or an alias (smollm2-135m-instruct)"
            ) from None
        return cls(model, tokenizer, **kwargs)

    @property
    def context_window(self) -> int:
        return self._context_window

    def render(self, chat: Chat) -> str:
        """The prompt text. A chat that ends with an assistant message is continued from it (a prefill)."""
        if chat and chat[-1]["role"] == "assistant":
            return self.tokenizer.apply_chat_template(chat, continue_final_message=True, tokenize=False)
        return self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)

    def count_tokens(self, chat: Chat) -> int:
        return len(self.tokenizer(self.render(chat), add_special_tokens=False)["input_ids"])

    # LoRA adapters -------------------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str | Path) -> None:
        """Load a peft LoRA adapter under `name` (kept in memory; switch with `use_adapter`)."""
        from peft import PeftModel

        path = str(path)
        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"no LoRA adapter at {path!r} (adapter_config.json missing)")
        if isinstance(self.model, PeftModel):
            if name not in self.model.peft_config:
                self.model.load_adapter(path, adapter_name=name)
        else:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name).eval()
        self.adapters[name] = path
        self._prefix_kv.clear()  # new weights: no stored prefix was computed with them
        self.use_adapter(name)

    def use_adapter(self, name: str | None) -> None:
        """Switch the active adapter; None runs the base model."""
        if name is not None and name not in self.adapters:
            raise BackendError(f"unknown adapter {name!r}; loaded: {', '.join(self.adapters) or 'none'}")
        if name != self.active_adapter:  # callers re-activate the same adapter per batch; keep its prefixes then
            self._prefix_kv.clear()
        self.active_adapter = name
        if name is not None:
            self.model.set_adapter(name)

    # Generation ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        start = time.perf_counter()
        texts = [self.render(chat) for chat in prompts]
        rows = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        prompt_lens = [len(r) for r in rows]
        shared = self._shared_prefix(rows)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        sample = params.temperature > 0
        gen_kwargs = {
            "max_new_tokens": params.max_new_tokens,
            "do_sample": sample,
            "pad_token_id": self.tokenizer.pad_token_id,
            "return_dict_in_generate": True,
            "output_scores": params.logprobs,
        }
        if sample:
            gen_kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        disabled = self.active_adapter is None and hasattr(self.model, "disable_adapter")
        with self.model.disable_adapter() if disabled else contextlib.nullcontext():
            if shared:
                batch = self._prefixed_batch(rows, shared)
                gen_kwargs["cache"] = self._expanded_prefix_kv(rows[0][:shared], len(rows))
            else:
                batch = self.tokenizer.pad({"input_ids": rows}, return_tensors="pt").to(self.device)
            out = self.model.generate(**batch, **gen_kwargs)
        new_tokens = out.sequences[:, batch["input_ids"].shape[1]:]
        logprobs = None
        if params.logprobs:
            steps = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # (B, T, V), tempered as sampled
            logprobs = steps.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        eos_ids = self._eos_ids()
        completions = []
        for i, row in enumerate(new_tokens.tolist()):
            cut = next((j for j, t in enumerate(row) if t in eos_ids), None)
            ids = row[: cut + 1] if cut is not None else row
            gen_ids = [t for t in ids if t not in eos_ids]
            text = self.tokenizer.decode(gen_ids, skip_special_tokens=True)
            text, stopped = apply_stop(text, params.stop)
            completions.append(Completion(
                text=text,
                token_ids=ids,
                prompt_tokens=prompt_lens[i],
                finish_reason="stop" if cut is not None or stopped else "length",
                logprobs=logprobs[i, : len(ids)].tolist() if logprobs is not None else None,
                prompt_text=texts[i],
            ))
        elapsed = time.perf_counter() - start
        for c in completions:
            c.latency_s = elapsed
        self.stats.record(completions, elapsed)
        return completions

    # Shared-prefix KV cache ---------------------------------------------------------------------------
    def _shared_prefix(self, rows: list[list[int]]) -> int:
        """Tokens all rows share, leaving each row at least one token of its own; 0 when not worth caching."""
        if not self.prefix_cache or len(rows) < 2:
            return 0
        length = min(len(r) for r in rows)
        common = next((i for i in range(length) if any(r[i] != rows[0][i] for r in rows[1:])), length)
        common = min(common, length - 1)
        return common if common >= self.min_shared_prefix else 0

    def _prefixed_batch(self, rows: list[list[int]], shared: int) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask laid out as [shared prefix][left padding][rest of the prompt]."""
        width = max(len(r) - shared for r in rows)
        ids = torch.full((len(rows), shared + width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, :shared] = torch.tensor(row[:shared])
            ids[i, shared + width - (len(row) - shared):] = torch.tensor(row[shared:])
            mask[i, :shared] = 1
            mask[i, shared + width - (len(row) - shared):] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def _expanded_prefix_kv(self, prefix: list[int], batch: int):
        """A fresh copy of the prefix's KV cache (computed once per prefix and adapter) repeated `batch` times."""
        key = (self.active_adapter, tuple(prefix))
        cache = self._prefix_kv.get(key)
        if cache is None:
            ids = torch.tensor([prefix], device=self.device)
            cache = self.model(input_ids=ids, use_cache=True).cache
            self._prefix_kv[key] = cache
            while len(self._prefix_kv) > _PREFIX_CACHE_ENTRIES:
                self._prefix_kv.popitem(last=False)
        self._prefix_kv.move_to_end(key)
        cache = copy.deepcopy(cache)  # generate extends the cache in place; the stored one must stay the prefix
        cache.batch_repeat_interleave(batch)
        return cache

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(gen_eos)
        return {i for i in ids if i is not None}

    def close(self) -> None:
        self.model = None
