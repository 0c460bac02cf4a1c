"""The transformers backend's prefix KV cache: per row, across calls, so an agent's turn prefills only what is new.

In the agent loop every slot's prompt starts with the same system prompt and lessons block, and each turn's
prompt is the previous turn's prompt plus the reply and the next observation; prefill is compute-bound on CPU,
so re-running that history every turn is what caps the speedup of more slots. After each call the KV cache of
every row's tokens (prompt and reply, cut at EOS) is kept; at the next call every row takes the stored sequence
with the longest common token prefix and only its new suffix is prefilled. Rows that match nothing (a cold
start) share their common prefix instead: it is run once for all of them (the rule and the splice are OPCD's
teacher's too: `modelkit.prefix_kv`). The batch is laid out as [left padding][cached part][padding][new
part] and the rows' cached KV is left-padded to the same width; position ids come from the attention mask, so
every row sees the same positions as without the cache and greedy decoding gives the same tokens. Any prompt is
correct, a prompt whose history lost its oldest turns just matches less. The store is an LRU,
holding sequences of one set of weights: the backend clears it when the active adapter changes (and while a
cycle trains: `agent_runtime.llm.making_room`). The store is bounded in bytes, and optionally in tokens.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from modelkit.prefix_kv import (
    MIN_SHARED_PREFIX,
    CachedSequence,
    batched_cache,
    common_prefix,
    plain_kv_layers,
    run_prefix,
    shared_prefix_length,
)


@dataclass
class PrefixCacheStats:
    """What the prefix cache saved, summed over calls; `prefilled_tokens` counts every prompt token run through
    the model (a shared prefix once), so `prefilled_tokens / prompt_tokens` is the prefill left to do."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from a stored sequence of an earlier call
    shared_tokens: int = 0  # prompt tokens covered by a prefix run once for several rows of the call
    prefilled_tokens: int = 0
    scored_tokens: int = 0  # choice mode: action tokens run behind the prompts (each set's distinct prefixes)
    evicted: int = 0  # stored sequences dropped to stay within the store's bounds


class PrefixCache:
    """Stored sequences of the active weights, least recently used first, and the planning of each call.

    A row reuses a stored sequence, or a prefix shared with other rows of the call, only when that covers at
    least `min_shared_prefix` of its prompt tokens; `max_bytes` and `max_tokens` bound the store (0 keeps nothing across
    calls). `enabled` is False for models whose cache cannot be spliced (see `plain_kv_layers`)."""

    def __init__(
        self,
        model,
        *,
        enabled: bool = True,
        min_shared_prefix: int = MIN_SHARED_PREFIX,
        max_tokens: int | None = None,
        max_bytes: int = 512 * 2**20,
    ):
        """`max_bytes` bounds the stored KV's memory, `max_tokens` (None: no bound) its tokens; the least recently
        used sequences go first, and 0 in either keeps nothing across calls."""
        self.layers = plain_kv_layers(model)
        self._enabled = enabled and self.layers > 0
        self.min_shared_prefix = min_shared_prefix
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes
        self.stats = PrefixCacheStats()
        self.entries: OrderedDict[int, CachedSequence] = OrderedDict()
        self.tokens = 0  # summed over the stored sequences
        self.bytes = 0
        self._keys = itertools.count()

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = value and self.layers > 0

    @property
    def keeps(self) -> bool:
        """Whether anything is stored across calls (both bounds above 0)."""
        return self.max_bytes > 0 and (self.max_tokens is None or self.max_tokens > 0)

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = self.bytes = 0

    def _over(self) -> bool:
        return self.bytes > self.max_bytes or (self.max_tokens is not None and self.tokens > self.max_tokens)

    def _drop(self, key: int) -> None:
        entry = self.entries.pop(key)
        self.tokens -= len(entry.ids)
        self.bytes -= _nbytes(entry)

    def shared_prefix(self, rows: list) -> int:
        """Tokens all rows share, leaving each row at least one token of its own; 0 when not worth caching."""
        return shared_prefix_length(rows, self.min_shared_prefix) if self._enabled else 0

    def plan(self, model, rows: list[np.ndarray]) -> tuple[list[CachedSequence | None], list[int]]:
        """For every row, the cached sequence it starts from and how many of its tokens that covers (0: none).

        A row takes the stored sequence with the longest common prefix; rows left without one share their
        common prefix, run once here through `model`. Every row keeps at least one token to prefill (generate
        needs one).
        """
        sources: list[CachedSequence | None] = [None] * len(rows)
        cached = [0] * len(rows)
        stats = self.stats
        stats.prompt_tokens += sum(len(r) for r in rows)
        if self._enabled:
            for i, row in enumerate(rows):
                best, best_len = None, 0
                for key, entry in self.entries.items():
                    n = common_prefix(row, entry.ids)
                    if n > best_len:
                        best, best_len = key, n
                best_len = min(best_len, len(row) - 1)
                if best_len >= self.min_shared_prefix:
                    sources[i], cached[i] = self.entries[best], best_len
                    self.entries.move_to_end(best)
            stats.reused_tokens += sum(cached)
            cold = [i for i in range(len(rows)) if sources[i] is None]
            shared = self.shared_prefix([rows[i] for i in cold])
            if shared:
                prefix = run_prefix(model, rows[cold[0]][:shared])
                for i in cold:
                    sources[i], cached[i] = prefix, shared
                stats.shared_tokens += shared * len(cold)
                stats.prefilled_tokens += shared
        stats.prefilled_tokens += sum(len(r) - c for r, c in zip(rows, cached))
        return sources, cached

    @staticmethod
    def batch_inputs(
        rows: list[list[int]], cached: list[int], pad_id: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask laid out as [left pad][cached part][pad][rest of the prompt]."""
        width, rest = max(cached), max(len(r) - c for r, c in zip(rows, cached))
        ids = torch.full((len(rows), width + rest), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (row, c) in enumerate(zip(rows, cached)):
            ids[i, width - c : width] = torch.tensor(row[:c], dtype=torch.long)
            ids[i, width + rest - (len(row) - c) :] = torch.tensor(row[c:], dtype=torch.long)
            mask[i, width - c : width] = 1
            mask[i, width + rest - (len(row) - c) :] = 1
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}

    def batch_cache(self, sources: list[CachedSequence | None], cached: list[int], capacity: int):
        """The call's cache: every row's cached part, room for `capacity` tokens per row."""
        return batched_cache(sources, cached, capacity, self.layers)

    def keep(self, cache, row: int, positions: torch.Tensor, ids: np.ndarray, prompt_len: int) -> None:
        """Store row `row` of a call's cache: the KV at `positions` (its real tokens, in order) for `ids`."""
        if not self.keeps:
            return
        # one block for all its layers' keys and values: a sequence of more than ~20 tokens is then a mapping of
        # its own, returned to the system when the store drops it. As ~60 tensors of a few hundred KB each it
        # sat in the heap, and the store's churn left the heap holding free chunks it could not give back.
        layers = cache.layers
        first = layers[0].keys[row]
        block = first.new_empty((2, len(layers), first.shape[0], len(positions), first.shape[2]))
        for i, layer in enumerate(layers):
            torch.index_select(layer.keys[row], 1, positions, out=block[0, i])
            torch.index_select(layer.values[row], 1, positions, out=block[1, i])
        self.insert(CachedSequence(ids, prompt_len, list(block[0]), list(block[1])))

    def keep_generated(
        self, out, mask: torch.Tensor, rows: list[np.ndarray], generated: list[list[int]], cuts: list[int | None]
    ) -> None:
        """Keep every row's KV after `generate`: its prompt tokens (where the mask is 1) and the generated tokens
        that went through the model (all but the last sampled one, up to EOS)."""
        cache = getattr(out, "cache", None)
        width, steps = mask.shape[1], len(generated[0])
        if not self.keeps or cache is None or cache.get_seq_length() != width + steps - 1:
            return
        for i, row in enumerate(rows):
            fed = min(cuts[i] + 1, steps - 1) if cuts[i] is not None else steps - 1
            positions = torch.cat([mask[i].nonzero().squeeze(1), torch.arange(width, width + fed, device=mask.device)])
            self.keep(
                cache, i, positions, np.concatenate([row, np.asarray(generated[i][:fed], dtype=np.int64)]), len(row)
            )

    def insert(self, entry: CachedSequence) -> None:
        """Add a sequence; one whose prompt it continues is superseded (that slot moved on), and the least
        recently used go while the store is over its bounds."""
        size = _nbytes(entry)
        if size > self.max_bytes or (self.max_tokens is not None and len(entry.ids) > self.max_tokens):
            return
        for key, old in list(self.entries.items()):
            if common_prefix(old.ids, entry.ids) >= old.prompt_len:
                self._drop(key)
        self.entries[next(self._keys)] = entry
        self.tokens += len(entry.ids)
        self.bytes += size
        while self._over():
            self._drop(next(iter(self.entries)))
            self.stats.evicted += 1


def _nbytes(entry: CachedSequence) -> int:
    return sum(t.numel() * t.element_size() for t in (*entry.keys, *entry.values))
