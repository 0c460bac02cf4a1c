"""The `transformers` policy backend: batched generation with a Hugging Face causal LM, CPU or CUDA.

Prompts are rendered with the tokenizer's chat template and tokenised by `modelkit.chat_tokens.encode_chat`
(content is data: special-token text in it stays text), left-padded into one batch (decoder-only models
continue from the right edge, so padding goes on the left), generated with the KV cache, and cut at the first
EOS or stop string. A seeded call (`SamplingParams.seeds`, or `seed`: `llm.base.row_seeds`) gives every row its own
CPU generator: its tokens and its pick of an action are drawn from that alone, so a row samples the same whatever
shares its batch (a `RowSeededBackend`; the scores it draws from can differ with the batch in their last bits only).
Unseeded, sampling uses torch's global generator.

LoRA adapters (peft) are loaded by name and switched with `use_adapter(name)`; `use_adapter(None)` gives the
base model. Each loaded adapter's fingerprint (`modelkit.fingerprint`) is computed from the tensors peft put in the
model, and `adapter_fingerprint()` reports the one of the adapter peft itself has active: what the model
computes with, not what this class was told. `dtype: auto` is float32 on every device: acting in bf16 lost
most of what a small OPCD adapter had learned (bench/RESULTS.md "Acting in bfloat16": the same adapters won far
fewer held-out games in bf16 than in float32, while the base model and the lesson in context barely moved): the
adapter's change to each layer's output is below bf16's resolution of the
residual stream, so it is rounded away. bf16 also made a seeded run's table depend on the CPU. `dtype:
bfloat16` still asks for it (faster generation on CPUs with native bf16; half the memory of a large model
on a GPU), for adapters whose effect is large enough to survive it.

A prefix KV cache (per row, across calls: `agent_runtime.llm.prefix_cache`) makes an agent's next turn
prefill only its new observation; the same greedy tokens as without it. Choice mode (`choose`) scores every
admissible action in one packed forward (`modelkit.choice`) continuing the same cache, each distinct token
prefix of the set once (a trie; `choice_tree = False` feeds every action whole, the same scores).
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from agent_runtime.llm.base import BackendError, BackendStats, Chat, Completion, SamplingParams, apply_stop, row_seeds
from agent_runtime.llm.prefix_cache import PrefixCache, PrefixCacheStats
from modelkit.chat_tokens import encode_chat, render_chat
from modelkit.choice import (
    ActionTrie,
    action_nodes,
    action_token_ids,
    choice_distribution,
    choice_logprobs,
    lm_parts,
    pack_choices,
)
from modelkit.fingerprint import fingerprint_state
from modelkit.prefix_kv import MIN_SHARED_PREFIX, kv_bytes_per_token
from modelkit.sampler import InverseCDFSampler, folded_head

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
    """float32 on every device: bf16 rounds a small adapter's effect away (module docstring). `device` is kept
    for the callers that resolve a dtype per device."""
    return torch.float32


class TransformersBackend:
    name = "transformers"
    row_seeded = True
    # choice mode scores each distinct token prefix of an action set once; False: every action whole (to compare)
    choice_tree = True

    def __init__(
        self,
        model,
        tokenizer,
        *,
        context_window: int | None = None,
        device: str = "cpu",
        dtype: str = "auto",
        prefix_cache: bool = True,
        min_shared_prefix: int = MIN_SHARED_PREFIX,
        prefix_cache_mb: float = 512.0,
        prefix_cache_tokens: int | None = None,
        choice_trie_above: int = 256,
        choice_batch_mb: float = 64.0,
    ):
        """Wrap an already loaded model and tokenizer (tests build tiny ones in code).

        `prefix_cache` turns the prefix KV cache on; a row reuses a stored sequence, or a prefix shared with
        other rows of the call, only when that covers at least `min_shared_prefix` of its prompt tokens.
        `prefix_cache_mb` bounds the memory of the stored sequences (least recently used go first; 0 keeps nothing
        across calls), and `prefix_cache_tokens`, when given, their tokens too. A stored token costs 2 x layers x
        kv_heads x head_dim x bytes per value: SmolLM2-135M (30 layers, 3 KV heads of 64) 45 KB in float32, 22.5
        KB in bf16, so the default 512 MB holds ~11k tokens in float32 (8 slots of 1.4k-token prompts) and twice
        that in bf16. Models whose cache is not one plain (key, value) pair per layer (sliding windows,
        recurrent state) run without the cache.

        `choice_trie_above`: in choice mode, action sets larger than this are decoded under a token-trie
        constraint instead of having every action scored (the packed scoring grows with the set's distinct token
        prefixes). `choice_batch_mb` bounds the KV cache of one packed choice forward (rows x their prompt tokens
        and action columns x the KV a token costs): a call's rows go through in groups within it, each group's rows
        stored before the next group reuses their shared prefix. The cache of a whole call (8 slots of 400-token
        prompts: 147 MB for SmolLM2 in float32) is a copy beside the store, so it lands on a phase's peak; groups
        within 64 MB take ~3 rows of such prompts.
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
        self.fingerprints: dict[str, str] = {}  # by peft key, of the tensors in the model after loading
        self._peft_keys: dict[str, str] = {}  # adapter name -> the key peft keeps it under
        self.active_adapter: str | None = None
        self.stats = BackendStats()
        # stored sequences of the active adapter; cleared when the weights change
        self.prefix_kv = PrefixCache(
            self.model,
            enabled=prefix_cache,
            min_shared_prefix=min_shared_prefix,
            max_tokens=prefix_cache_tokens,
            max_bytes=int(prefix_cache_mb * 2**20),
        )
        self.choice_trie_above = choice_trie_above
        self.choice_batch_bytes = int(choice_batch_mb * 2**20)

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
        return render_chat(self.tokenizer, chat)

    def count_tokens(self, chat: Chat) -> int:
        return len(encode_chat(self.tokenizer, chat).ids)

    # LoRA adapters -------------------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str | Path) -> None:
        """Load a peft LoRA adapter under `name` (kept in memory; switch with `use_adapter`). Any name is
        accepted: peft keeps the adapter under a module-safe key ("run.v2" -> "run_v2")."""
        from peft import PeftModel, get_peft_model_state_dict

        path = str(path)
        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"no LoRA adapter at {path!r} (adapter_config.json missing)")
        key = self._peft_key(name)
        if isinstance(self.model, PeftModel):
            if key not in self.model.peft_config:
                self.model.load_adapter(path, adapter_name=key)
        else:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=key).eval()
        self.adapters[name] = path
        self.fingerprints[key] = fingerprint_state(get_peft_model_state_dict(self.model, adapter_name=key))
        self.clear_prefix_cache()  # new weights: no stored sequence was computed with them
        self.use_adapter(name)

    def _peft_key(self, name: str) -> str:
        """The key peft keeps adapter `name` under: a torch module name ('.' and '' are refused there), one per
        name."""
        if name not in self._peft_keys:
            taken = set(self._peft_keys.values())
            key = base = re.sub(r"[^\w-]", "_", name) or "_"
            suffix = 0
            while key in taken:
                suffix += 1
                key = f"{base}-{suffix}"
            self._peft_keys[name] = key
        return self._peft_keys[name]

    def use_adapter(self, name: str | None) -> None:
        """Switch the active adapter; None runs the base model."""
        if name is not None and name not in self.adapters:
            raise BackendError(f"unknown adapter {name!r}; loaded: {', '.join(self.adapters) or 'none'}")
        if name != self.active_adapter:  # callers re-activate the same adapter per batch; keep its cache then
            self.clear_prefix_cache()
        self.active_adapter = name
        if name is not None:
            self.model.set_adapter(self._peft_keys[name])

    def adapter_fingerprint(self) -> str | None:
        """The fingerprint of the adapter the model computes with (peft's active one; None: the base model)."""
        if self.active_adapter is None or not self.fingerprints:
            return None
        active = self.model.active_adapter
        return self.fingerprints.get(active if isinstance(active, str) else active[0])

    # Generation ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[Chat], params: SamplingParams, *, tries: list | None = None) -> list[Completion]:
        """Batched generation; with `tries` (one `ActionTrie` per chat) decoding is constrained to each row's
        action set, token by token (choice mode for sets too large to score whole)."""
        if not prompts:
            return []
        start = time.perf_counter()
        encoded = [encode_chat(self.tokenizer, chat) for chat in prompts]
        texts, rows = [p.text for p in encoded], [p.ids for p in encoded]
        prompt_lens = [len(r) for r in rows]
        # Sampling runs as a logits processor on generate's greedy path (see InverseCDFSampler); it records
        # the logprobs itself, since the scores generate keeps are then its one-hot choice.
        sampler = None
        if params.temperature > 0:
            sampler = InverseCDFSampler(params.temperature, params.top_p, _generators(params, len(prompts)))
        gen_kwargs = {
            "max_new_tokens": params.max_new_tokens,
            "do_sample": False,
            "pad_token_id": self.tokenizer.pad_token_id,
            "return_dict_in_generate": True,
            "output_scores": params.logprobs and sampler is None,
        }
        if sampler is not None:
            from transformers import LogitsProcessorList

            gen_kwargs["logits_processor"] = LogitsProcessorList([sampler])
        arrays = [np.asarray(r, dtype=np.int64) for r in rows]
        disabled = self.active_adapter is None and hasattr(self.model, "disable_adapter")
        with self.model.disable_adapter() if disabled else contextlib.nullcontext():
            sources, cached = self.prefix_kv.plan(self.model, arrays)
            if any(cached):
                batch = self.prefix_kv.batch_inputs(rows, cached, self.tokenizer.pad_token_id, self.device)
            else:
                batch = self.tokenizer.pad({"input_ids": rows}, return_tensors="pt").to(self.device)
            if tries is not None:
                gen_kwargs["prefix_allowed_tokens_fn"] = self._trie_constraint(tries, batch["input_ids"].shape[1])
            if self.prefix_cache:  # off: the stock path, which the tests compare against
                capacity = batch["input_ids"].shape[1] + params.max_new_tokens
                gen_kwargs["cache"] = self.prefix_kv.batch_cache(sources, cached, capacity)
            with folded_head(self.model):  # the prefill's last positions reach the head without a per-row copy
                out = self.model.generate(**batch, **gen_kwargs)
        width = batch["input_ids"].shape[1]
        new_tokens = out.sequences[:, width:]
        logprobs = None
        if params.logprobs and sampler is not None:
            logprobs = torch.stack(sampler.logprobs, dim=1)[:, : new_tokens.shape[1]]  # tempered, as sampled
        elif params.logprobs:
            steps = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # (B, T, V)
            logprobs = steps.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        eos_ids = self._eos_ids()
        generated = new_tokens.tolist()
        cuts = [next((j for j, t in enumerate(row) if t in eos_ids), None) for row in generated]
        if self.prefix_cache:
            self.prefix_kv.keep_generated(out, batch["attention_mask"], arrays, generated, cuts)
        completions = []
        for i, row in enumerate(generated):
            cut = cuts[i]
            ids = row[: cut + 1] if cut is not None else row
            gen_ids = [t for t in ids if t not in eos_ids]
            text = self.tokenizer.decode(gen_ids, skip_special_tokens=True)
            text, stopped = apply_stop(text, params.stop)
            completions.append(
                Completion(
                    text=text,
                    token_ids=ids,
                    prompt_tokens=prompt_lens[i],
                    finish_reason="stop" if cut is not None or stopped else "length",
                    logprobs=logprobs[i, : len(ids)].tolist() if logprobs is not None else None,
                    prompt_text=texts[i],
                )
            )
        elapsed = time.perf_counter() - start
        for c in completions:
            c.latency_s = elapsed
        self.stats.record(completions, elapsed)
        return completions

    # Choice mode -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def choose(self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams) -> list[Completion]:
        """One action per chat, drawn from softmax(log p(action | chat) / temperature) over its set (greedy at
        temperature 0). Every action's sequence log-probability (its tokens and the end-of-turn token) comes
        from one packed forward per group of rows (`modelkit.choice`), continuing each row's cached prefix;
        the chosen action's KV is kept, so the next turn, whose prompt continues with it, reuses all of it."""
        if not prompts:
            return []
        assert len(prompts) == len(choices) and all(choices), "a non-empty action set per chat"
        start = time.perf_counter()
        encoded = [encode_chat(self.tokenizer, chat) for chat in prompts]
        texts, rows = [p.text for p in encoded], [p.ids for p in encoded]
        end_id = self.tokenizer.eos_token_id
        actions = [
            action_token_ids(self.tokenizer, chat, row, options, end_id)
            for chat, row, options in zip(prompts, rows, choices)
        ]
        seeds = row_seeds(params, len(prompts))
        generators = _generators(params, len(prompts))
        completions: list[Completion] = [None] * len(rows)  # type: ignore[list-item]
        scored = [i for i, options in enumerate(choices) if len(options) <= self.choice_trie_above]
        for group in self._choice_groups([rows[i] for i in scored], [actions[i] for i in scored]):
            group = [scored[g] for g in group]
            scores, stored = self._score_group([rows[i] for i in group], [actions[i] for i in group])
            picks = []
            for i, logp in zip(group, scores):
                # the policy acted with; at temperature 0 the recorded distribution is the untempered one
                dist = choice_distribution(logp.float().cpu(), params.temperature or 1.0)
                if params.temperature == 0:
                    pick = int(logp.argmax())
                else:
                    generator = generators[i] if generators else None
                    pick = int(torch.multinomial(dist.exp(), 1, generator=generator))
                picks.append(pick)
                completions[i] = Completion(
                    text=choices[i][pick],
                    token_ids=actions[i][pick],
                    prompt_tokens=len(rows[i]),
                    logprobs=[float(dist[pick])],
                    prompt_text=texts[i],
                    choice_logprobs=dist.tolist(),
                )
            stored(picks)
        large = [i for i in range(len(rows)) if completions[i] is None]
        if large:  # sets too large to score whole: decode constrained to the set's token trie
            tries = [ActionTrie(choices[i], actions[i]) for i in large]
            longest = max(len(a) for i in large for a in actions[i])
            decoded = self.generate(
                [prompts[i] for i in large],
                replace(
                    params,
                    max_new_tokens=longest,
                    logprobs=True,
                    stop=(),
                    seeds=tuple(seeds[i] for i in large) if seeds else None,
                ),
                tries=tries,
            )
            for i, trie, completion in zip(large, tries, decoded):
                completion.text = trie.action(completion.token_ids)
                assert completion.text is not None, "constrained decoding left the action set"
                completion.logprobs = [sum(completion.logprobs or [])]
                completions[i] = completion
        elapsed = time.perf_counter() - start
        for c in completions:
            c.latency_s = elapsed
        self.stats.record(completions, elapsed)
        return completions

    def _trie_constraint(self, tries: list, width: int):
        """generate's `prefix_allowed_tokens_fn`: row i may only continue an action of `tries[i]`."""
        pad, eos_ids = self.tokenizer.pad_token_id, self._eos_ids()

        def allowed(row: int, ids: torch.Tensor) -> list[int]:
            generated = ids[width:].tolist()
            if any(t in eos_ids for t in generated):
                return [pad]  # finished: generate pads the row from here on
            return tries[row].allowed(generated) or [pad]

        return allowed

    def _choice_groups(self, rows: list[list[int]], actions: list[list[list[int]]], budget: int = 1 << 24):
        """Rows in groups whose packed attention mask (rows x queries x keys) stays within `budget` entries and
        whose KV cache (rows x keys x a token's KV) within `choice_batch_bytes`; a row alone is a group."""
        per_token = kv_bytes_per_token(self.model)
        group, widest, longest = [], 0, 0
        for i, (row, acts) in enumerate(zip(rows, actions)):
            columns = len(action_nodes(acts, tree=self.choice_tree).tokens)
            w, n = max(widest, columns), max(longest, len(row))
            size = (len(group) + 1) * (w + n)
            if group and (size * (w + n) > budget or size * per_token > self.choice_batch_bytes):
                yield group
                group, w, n = [], columns, len(row)
            group.append(i)
            widest, longest = w, n
        if group:
            yield group

    def _score_group(self, rows: list[list[int]], actions: list[list[list[int]]]):
        """(sequence log-probabilities of every action of every row, `store(picks)`): the rows' cached prefixes
        are continued, and `store` keeps each row's prompt plus its picked action in the prefix cache."""
        from peft import PeftModel

        lm = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
        decoder, head = lm_parts(lm)
        arrays = [np.asarray(r, dtype=np.int64) for r in rows]
        disabled = self.active_adapter is None and hasattr(self.model, "disable_adapter")
        with self.model.disable_adapter() if disabled else contextlib.nullcontext():
            sources, cached = self.prefix_kv.plan(self.model, arrays)
            past_width = max(cached)
            packed = pack_choices(
                [r[c:] for r, c in zip(rows, cached)],
                actions,
                pad_id=self.tokenizer.pad_token_id,
                past_lengths=cached,
                past_width=past_width,
                tree=self.choice_tree,
            )
            cache = None
            if self.prefix_cache:
                cache = self.prefix_kv.batch_cache(sources, cached, past_width + packed.input_ids.shape[1])
            scores = choice_logprobs(decoder, head, packed, past=cache)
            self.prefix_kv.stats.scored_tokens += sum(packed.columns)

        def store(picks: list[int]) -> None:
            if cache is None:
                return
            for i, (row, pick) in enumerate(zip(arrays, picks)):
                path = packed.paths[i][pick]
                rest = len(row) - cached[i]
                positions = torch.cat(
                    [
                        torch.arange(past_width - cached[i], past_width),
                        torch.arange(past_width + packed.rest - rest, past_width + packed.rest),
                        past_width + torch.tensor(path, dtype=torch.long),
                    ]
                ).to(self.device)
                ids = np.concatenate([row, np.asarray(packed.targets[i][pick][: len(path)], dtype=np.int64)])
                self.prefix_kv.keep(cache, i, positions, ids, len(row))

        return scores, store

    # Prefix KV cache (`agent_runtime.llm.prefix_cache`) ----------------------------------------------------
    @property
    def prefix_cache(self) -> bool:
        """Whether the prefix KV cache is on (settable: False runs the stock path, which the tests compare to)."""
        return self.prefix_kv.enabled

    @prefix_cache.setter
    def prefix_cache(self, value: bool) -> None:
        self.prefix_kv.enabled = value

    @property
    def prefix_stats(self) -> PrefixCacheStats:
        return self.prefix_kv.stats

    def clear_prefix_cache(self) -> None:
        self.prefix_kv.clear()

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


def _generators(params: SamplingParams, rows: int) -> list[torch.Generator] | None:
    """One CPU generator per row, seeded with its seed (`row_seeds`); None for an unseeded call. On the CPU whatever
    the model's device: the same draws on any device, and no generator state on a GPU."""
    seeds = row_seeds(params, rows)
    return None if seeds is None else [torch.Generator().manual_seed(seed) for seed in seeds]
