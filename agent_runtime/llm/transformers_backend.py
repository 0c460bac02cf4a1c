"""The `transformers` policy backend: batched generation with a Hugging Face causal LM, CPU or CUDA.

Prompts are rendered with the tokenizer's chat template and tokenised by `distill.chat_tokens.encode_chat`
(content is data: special-token text in it stays text), left-padded into one batch (decoder-only models
continue from the right edge, so padding goes on the left), generated with the KV cache, and cut at the first
EOS or stop string. Sampling is seeded per call when `SamplingParams.seed` is set, so a run repeats.

LoRA adapters (peft) are loaded by name and switched with `use_adapter(name)`; `use_adapter(None)` gives the
base model. With `dtype: auto` the model runs in bf16 on CUDA and on CPUs with native bf16 support
(AVX512-BF16/AMX: measured 1.7x faster generation than fp32 for SmolLM2-135M on this kind of machine, see
bench/RESULTS.md), else in float32.

Prefix KV cache (per row, across calls): in the agent loop every slot's prompt starts with the same system
prompt and lessons block, and each turn's prompt is the previous turn's prompt plus the reply and the next
observation; prefill is compute-bound on CPU, so re-running that history every turn is what caps the speedup
of more slots. After each call the KV cache of every row's tokens (prompt and reply, cut at EOS) is kept; at
the next call every row takes the stored sequence with the longest common token prefix and only its new
suffix is prefilled. Rows that match nothing (a cold start) share their common prefix instead: it is run
once for all of them. The batch is laid out as [left padding][cached part][padding][new part] and the rows'
cached KV is left-padded to the same width; position ids come from the attention mask, so every row sees the
same positions as without the cache and greedy decoding gives the same tokens. Any prompt is correct, a
prompt whose history lost its oldest turns just matches less. The store is an LRU bounded in tokens.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from agent_runtime.llm.base import BackendError, BackendStats, Chat, Completion, SamplingParams, apply_stop
from distill.chat_tokens import encode_chat, render_chat
from distill.opcd.choice import (
    ActionTrie,
    action_token_ids,
    choice_distribution,
    choice_logprobs,
    lm_parts,
    pack_choices,
)

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


@dataclass
class _CachedSequence:
    """Token ids and their batch-1 KV cache, per layer (kv_heads, tokens, head_dim)."""

    ids: np.ndarray
    prompt_len: int  # the first `prompt_len` ids were the prompt, the rest the reply
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass
class PrefixCacheStats:
    """What the prefix cache saved, summed over calls; `prefilled_tokens` counts every prompt token run through
    the model (a shared prefix once), so `prefilled_tokens / prompt_tokens` is the prefill left to do."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from a stored sequence of an earlier call
    shared_tokens: int = 0  # prompt tokens covered by a prefix run once for several rows of the call
    prefilled_tokens: int = 0
    evicted: int = 0  # stored sequences dropped to stay within the token budget


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _plain_kv_layers(model) -> int:
    """The number of layers when the model's cache is one plain growing (key, value) pair per layer (no sliding
    windows, no recurrent state), else 0. Only then can a row's KV be cut out and spliced into another batch."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 -- a config the cache cannot read: treat as not spliceable
        return 0
    return len(cache.layers) if all(type(layer) is DynamicLayer for layer in cache.layers) else 0


@functools.cache
def _preallocated_layer_class():
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A cache layer that writes new tokens into room allocated up front instead of concatenating: the stock
        layer's torch.cat copies the whole cache at every decode step (10% of the CPU time in a profile at
        batch 8 with ~700 tokens of context; a batch-8 call measured 3-4% faster with this layer). `keys` and
        `values` are views of the filled part."""

        def __init__(self, capacity: int, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
                     filled: int = 0):
            super().__init__()
            self.capacity, self.filled = capacity, filled
            self.key_room, self.value_room = keys, values  # (batch, kv_heads, capacity, head_dim) or None
            if keys is not None:
                self.lazy_initialization(keys, values)
                self.keys, self.values = keys[:, :, :filled], values[:, :, :filled]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, end = self.filled, self.filled + key_states.shape[-2]
            if self.key_room is None or end > self.key_room.shape[-2]:  # more than planned: grow
                shape = (*key_states.shape[:2], max(end, self.capacity, 2 * start), key_states.shape[-1])
                key_room, value_room = key_states.new_zeros(shape), value_states.new_zeros(shape)
                if start:
                    key_room[:, :, :start], value_room[:, :, :start] = self.keys, self.values
                self.key_room, self.value_room = key_room, value_room
            self.key_room[:, :, start:end] = key_states
            self.value_room[:, :, start:end] = value_states
            self.filled = end
            self.keys, self.values = self.key_room[:, :, :end], self.value_room[:, :, :end]
            return self.keys, self.values

    return PreallocatedLayer


class InverseCDFSampler:
    """Samples the next token from softmax(scores / temperature), restricted to the top-p nucleus, as a logits
    processor: it returns scores that are 0 at the drawn token and -inf elsewhere, so generate's greedy step
    picks it. One uniform number per row and a search in the cumulative distribution replace
    `torch.multinomial`, which draws a random number per vocabulary entry: at batch 8 over SmolLM2's 49k
    tokens that was 8 ms of a ~110 ms CPU decode step. Seeded like the rest of the call (torch's global
    generator). `logprobs` keeps the drawn tokens' log-probabilities under the tempered, nucleus-renormalised
    distribution, one (batch,) tensor per step."""

    def __init__(self, temperature: float, top_p: float = 1.0):
        self.temperature, self.top_p = temperature, top_p
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logp = (scores.float() / self.temperature).log_softmax(-1)
        if self.top_p < 1.0:
            sorted_logp, order = logp.sort(-1, descending=True)
            mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()
            sorted_logp = sorted_logp.masked_fill(mass_before >= self.top_p, float("-inf"))  # keeps the top token
            logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp).log_softmax(-1)
        cdf = logp.exp().cumsum(-1)
        u = torch.rand(cdf.shape[0], 1, device=cdf.device) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
        self.logprobs.append(logp.gather(-1, tokens).squeeze(-1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, tokens, 0.0)


class TransformersBackend:
    name = "transformers"

    def __init__(self, model, tokenizer, *, context_window: int | None = None, device: str = "cpu",
                 dtype: str = "auto", prefix_cache: bool = True, min_shared_prefix: int = 32,
                 prefix_cache_tokens: int = 40960, choice_trie_above: int = 256):
        """Wrap an already loaded model and tokenizer (tests build tiny ones in code).

        `prefix_cache` turns the prefix KV cache on; a row reuses a stored sequence, or a prefix shared with
        other rows of the call, only when that covers at least `min_shared_prefix` of its prompt tokens.
        `prefix_cache_tokens` bounds the stored sequences (least recently used go first; 0 keeps nothing
        across calls). A stored token costs 2 x layers x kv_heads x head_dim x bytes per value: SmolLM2-135M
        (30 layers, 3 KV heads of 64) 45 KB in float32, 22.5 KB in bf16, so the default 40960 tokens (16 slots
        x 2.5k tokens) is at most 1.8 GB (fp32) of host or GPU memory. Models whose cache is not one plain
        (key, value) pair per layer (sliding windows, recurrent state) run without the cache.

        `choice_trie_above`: in choice mode, action sets larger than this are decoded under a token-trie
        constraint instead of having every action scored (the packed scoring grows with the set's tokens).
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
        self._layers = _plain_kv_layers(self.model)
        self.prefix_cache = prefix_cache and self._layers > 0
        self.min_shared_prefix = min_shared_prefix
        self.prefix_cache_tokens = prefix_cache_tokens
        self.prefix_stats = PrefixCacheStats()
        self.choice_trie_above = choice_trie_above
        # stored sequences of the active adapter, least recently used first; cleared when the weights change
        self._store: OrderedDict[int, _CachedSequence] = OrderedDict()
        self._store_tokens = 0
        self._store_ids = itertools.count()

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
        self.clear_prefix_cache()  # new weights: no stored sequence was computed with them
        self.use_adapter(name)

    def use_adapter(self, name: str | None) -> None:
        """Switch the active adapter; None runs the base model."""
        if name is not None and name not in self.adapters:
            raise BackendError(f"unknown adapter {name!r}; loaded: {', '.join(self.adapters) or 'none'}")
        if name != self.active_adapter:  # callers re-activate the same adapter per batch; keep its cache then
            self.clear_prefix_cache()
        self.active_adapter = name
        if name is not None:
            self.model.set_adapter(name)

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
        if params.seed is not None:
            torch.manual_seed(params.seed)
        # Sampling runs as a logits processor on generate's greedy path (see InverseCDFSampler); it records
        # the logprobs itself, since the scores generate keeps are then its one-hot choice.
        sampler = InverseCDFSampler(params.temperature, params.top_p) if params.temperature > 0 else None
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
            sources, cached = self._plan(arrays)
            if any(cached):
                batch = self._cached_batch(rows, cached)
            else:
                batch = self.tokenizer.pad({"input_ids": rows}, return_tensors="pt").to(self.device)
            if tries is not None:
                gen_kwargs["prefix_allowed_tokens_fn"] = self._trie_constraint(tries, batch["input_ids"].shape[1])
            if self.prefix_cache:  # off: the stock path, which the tests compare against
                capacity = batch["input_ids"].shape[1] + params.max_new_tokens
                gen_kwargs["cache"] = self._batched_cache(sources, cached, capacity)
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
            self._store_rows(out, batch["attention_mask"], arrays, generated, cuts)
        completions = []
        for i, row in enumerate(generated):
            cut = cuts[i]
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

    # Choice mode -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def choose(self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams) -> list[Completion]:
        """One action per chat, drawn from softmax(log p(action | chat) / temperature) over its set (greedy at
        temperature 0). Every action's sequence log-probability (its tokens and the end-of-turn token) comes
        from one packed forward per group of rows (`distill.opcd.choice`), continuing each row's cached prefix;
        the chosen action's KV is kept, so the next turn, whose prompt continues with it, reuses all of it."""
        if not prompts:
            return []
        assert len(prompts) == len(choices) and all(choices), "a non-empty action set per chat"
        start = time.perf_counter()
        encoded = [encode_chat(self.tokenizer, chat) for chat in prompts]
        texts, rows = [p.text for p in encoded], [p.ids for p in encoded]
        end_id = self.tokenizer.eos_token_id
        actions = [action_token_ids(self.tokenizer, chat, row, options, end_id)
                   for chat, row, options in zip(prompts, rows, choices)]
        if params.seed is not None:
            torch.manual_seed(params.seed)
        completions: list[Completion] = [None] * len(rows)  # type: ignore[list-item]
        scored = [i for i, options in enumerate(choices) if len(options) <= self.choice_trie_above]
        for group in self._choice_groups([rows[i] for i in scored], [actions[i] for i in scored]):
            group = [scored[g] for g in group]
            scores, stored = self._score_group([rows[i] for i in group], [actions[i] for i in group])
            picks = []
            for i, logp in zip(group, scores):
                # the policy acted with; at temperature 0 the recorded distribution is the untempered one
                dist = choice_distribution(logp.float().cpu(), params.temperature or 1.0)
                pick = int(logp.argmax()) if params.temperature == 0 else int(torch.multinomial(dist.exp(), 1))
                picks.append(pick)
                completions[i] = Completion(
                    text=choices[i][pick], token_ids=actions[i][pick], prompt_tokens=len(rows[i]),
                    logprobs=[float(dist[pick])], prompt_text=texts[i], choice_logprobs=dist.tolist())
            stored(picks)
        large = [i for i in range(len(rows)) if completions[i] is None]
        if large:  # sets too large to score whole: decode constrained to the set's token trie
            tries = [ActionTrie(choices[i], actions[i]) for i in large]
            longest = max(len(a) for i in large for a in actions[i])
            decoded = self.generate([prompts[i] for i in large], replace(params, max_new_tokens=longest, logprobs=True,
                                                                        stop=()), tries=tries)
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
        """Rows in groups whose packed attention mask (rows x queries x keys) stays within `budget` entries."""
        group, widest, longest = [], 0, 0
        for i, (row, acts) in enumerate(zip(rows, actions)):
            w, n = max(widest, sum(len(a) for a in acts)), max(longest, len(row))
            if group and (len(group) + 1) * (w + n) * (w + n) > budget:
                yield group
                group, w, n = [], sum(len(a) for a in acts), len(row)
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
            sources, cached = self._plan(arrays)
            past_width = max(cached)
            packed = pack_choices([r[c:] for r, c in zip(rows, cached)], actions, pad_id=self.tokenizer.pad_token_id,
                                  past_lengths=cached, past_width=past_width)
            cache = None
            if self.prefix_cache:
                cache = self._batched_cache(sources, cached, past_width + packed.input_ids.shape[1])
            scores = choice_logprobs(decoder, head, packed, past=cache)

        def store(picks: list[int]) -> None:
            if cache is None or self.prefix_cache_tokens <= 0:
                return
            for i, (row, pick) in enumerate(zip(arrays, picks)):
                start, fed = packed.segments[i][pick]
                rest = len(row) - cached[i]
                positions = torch.cat([
                    torch.arange(past_width - cached[i], past_width),
                    torch.arange(past_width + packed.rest - rest, past_width + packed.rest),
                    torch.arange(past_width + start, past_width + start + fed)]).to(self.device)
                ids = np.concatenate([row, np.asarray(packed.targets[i][pick][:fed], dtype=np.int64)])
                keys = [layer.keys[i].index_select(1, positions) for layer in cache.layers]
                values = [layer.values[i].index_select(1, positions) for layer in cache.layers]
                self._insert(_CachedSequence(ids, len(row), keys, values))

        return scores, store

    # Prefix KV cache -----------------------------------------------------------------------------------
    def clear_prefix_cache(self) -> None:
        self._store.clear()
        self._store_tokens = 0

    def _plan(self, rows: list[np.ndarray]) -> tuple[list[_CachedSequence | None], list[int]]:
        """For every row, the cached sequence it starts from and how many of its tokens that covers (0: none).

        A row takes the stored sequence with the longest common prefix; rows left without one share their
        common prefix, run once here. Every row keeps at least one token to prefill (generate needs one).
        """
        sources: list[_CachedSequence | None] = [None] * len(rows)
        cached = [0] * len(rows)
        stats = self.prefix_stats
        stats.prompt_tokens += sum(len(r) for r in rows)
        if self.prefix_cache:
            for i, row in enumerate(rows):
                best, best_len = None, 0
                for key, entry in self._store.items():
                    n = _common_prefix(row, entry.ids)
                    if n > best_len:
                        best, best_len = key, n
                best_len = min(best_len, len(row) - 1)
                if best_len >= self.min_shared_prefix:
                    sources[i], cached[i] = self._store[best], best_len
                    self._store.move_to_end(best)
            stats.reused_tokens += sum(cached)
            cold = [i for i in range(len(rows)) if sources[i] is None]
            shared = self._shared_prefix([rows[i] for i in cold])
            if shared:
                prefix = self._run_prefix(rows[cold[0]][:shared])
                for i in cold:
                    sources[i], cached[i] = prefix, shared
                stats.shared_tokens += shared * len(cold)
                stats.prefilled_tokens += shared
        stats.prefilled_tokens += sum(len(r) - c for r, c in zip(rows, cached))
        return sources, cached

    def _shared_prefix(self, rows: list) -> int:
        """Tokens all rows share, leaving each row at least one token of its own; 0 when not worth caching."""
        if not self.prefix_cache or len(rows) < 2:
            return 0
        length = min(len(r) for r in rows)
        block = np.stack([np.asarray(r[:length], dtype=np.int64) for r in rows])
        diff = np.flatnonzero((block != block[0]).any(axis=0))
        common = min(int(diff[0]) if diff.size else length, length - 1)
        return common if common >= self.min_shared_prefix else 0

    def _run_prefix(self, ids: np.ndarray) -> _CachedSequence:
        cache = self.model(input_ids=torch.as_tensor(ids, device=self.device)[None], use_cache=True).cache
        return _CachedSequence(ids, len(ids), [layer.keys[0] for layer in cache.layers],
                               [layer.values[0] for layer in cache.layers])

    def _cached_batch(self, rows: list[list[int]], cached: list[int]) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask laid out as [left pad][cached part][pad][rest of the prompt]."""
        width, rest = max(cached), max(len(r) - c for r, c in zip(rows, cached))
        ids = torch.full((len(rows), width + rest), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (row, c) in enumerate(zip(rows, cached)):
            ids[i, width - c: width] = torch.tensor(row[:c], dtype=torch.long)
            ids[i, width + rest - (len(row) - c):] = torch.tensor(row[c:], dtype=torch.long)
            mask[i, width - c: width] = 1
            mask[i, width + rest - (len(row) - c):] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def _batched_cache(self, sources: list[_CachedSequence | None], cached: list[int], capacity: int):
        """A fresh cache with room for `capacity` tokens per row, holding every row's first `cached[i]` KV
        positions left-padded to the widest (the padding is masked out); the stored tensors are only read."""
        from transformers import DynamicCache

        layer_class = _preallocated_layer_class()
        width = max(cached)
        some = next((s for s in sources if s is not None), None)
        if some is None:
            layers = [layer_class(capacity) for _ in range(self._layers)]
        else:
            layers = []
            for layer in range(self._layers):
                ref = some.keys[layer]
                keys = ref.new_zeros((len(sources), ref.shape[0], capacity, ref.shape[2]))
                values = torch.zeros_like(keys)
                for i, (source, c) in enumerate(zip(sources, cached)):
                    if c:
                        keys[i, :, width - c: width] = source.keys[layer][:, :c]
                        values[i, :, width - c: width] = source.values[layer][:, :c]
                layers.append(layer_class(capacity, keys, values, width))
        cache = DynamicCache()
        cache.layers = layers
        return cache

    def _store_rows(self, out, mask: torch.Tensor, rows: list[np.ndarray], generated: list[list[int]],
                    cuts: list[int | None]) -> None:
        """Keep every row's KV: its prompt tokens (where the mask is 1) and the generated tokens that went
        through the model (all but the last sampled one, up to EOS)."""
        cache = getattr(out, "cache", None)
        width, steps = mask.shape[1], len(generated[0])
        if self.prefix_cache_tokens <= 0 or cache is None or cache.get_seq_length() != width + steps - 1:
            return
        for i, row in enumerate(rows):
            fed = min(cuts[i] + 1, steps - 1) if cuts[i] is not None else steps - 1
            positions = torch.cat([mask[i].nonzero().squeeze(1),
                                   torch.arange(width, width + fed, device=mask.device)])
            ids = np.concatenate([row, np.asarray(generated[i][:fed], dtype=np.int64)])
            keys = [layer.keys[i].index_select(1, positions) for layer in cache.layers]
            values = [layer.values[i].index_select(1, positions) for layer in cache.layers]
            self._insert(_CachedSequence(ids, len(row), keys, values))

    def _insert(self, entry: _CachedSequence) -> None:
        """Add a sequence; one whose prompt it continues is superseded (that slot moved on), and the least
        recently used go while the store is over its token budget."""
        if len(entry.ids) > self.prefix_cache_tokens:
            return
        for key, old in list(self._store.items()):
            if _common_prefix(old.ids, entry.ids) >= old.prompt_len:
                self._store_tokens -= len(self._store.pop(key).ids)
        self._store[next(self._store_ids)] = entry
        self._store_tokens += len(entry.ids)
        while self._store_tokens > self.prefix_cache_tokens:
            self._store_tokens -= len(self._store.popitem(last=False)[1].ids)
            self.prefix_stats.evicted += 1

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
