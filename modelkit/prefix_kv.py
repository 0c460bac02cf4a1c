"""The KV cache of a token prefix, computed once and spliced into a batch: shared by OPCD's teacher and the
transformers backend.

Both run many rows that start with the same tokens: the teacher's prompts share the system prompt and the
lessons (one lesson pool for the batch), and an agent loop's slots share the system prompt and lessons, each
turn continuing the slot's previous one. Prefill of that common part is the cost worth saving (on CPU it is
compute-bound, and a shared lesson context is most of the teacher's prompt tokens). The rules
and the splice live here once:

- `shared_prefix_length`: the tokens all rows share, leaving each row at least one token of its own (the last
  prompt position must be run to predict what follows), and 0 when that is below a minimum worth a separate
  pass (`min_shared_prefix` in both the OPCD config and the backend's options);
- `run_prefix`: the batch-1 KV of a token prefix, per layer; `FrozenPrefixes`: the same, kept for a model whose
  weights do not change while it lives (a cycle's fixed teacher), so that a prefix every step shares (the system
  prompt and the lessons) runs once per cycle instead of once per step;
- `batched_cache`: a cache holding each row's cached prefix, right-aligned to the widest ([left padding]
  [cached part]), with room allocated up front for what the call will add. The rows' attention mask covers
  those columns and position ids come from the mask, so each row sees the positions it has without the cache;
- `read_only_cache`: one prefix's KV that every row of a call reads (views, not copies) and none extends;
  `read_only_prefix`: the same for a prefix run with gradients, which a gradient-checkpointed layer may keep (its
  recompute in the backward pass reads the same states), so a checkpointed student still runs its rows' shared
  system prompt once.

Splicing needs a cache that is one plain growing (key, value) pair per layer (`plain_kv_layers`); models with
sliding windows or recurrent state run without it.
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

# the shortest prompt prefix shared by a batch's rows worth a separate pass: the trainer's and the acting backend's
MIN_SHARED_PREFIX = 32


@dataclass
class CachedSequence:
    """Token ids and their batch-1 KV cache, per layer (kv_heads, tokens, head_dim)."""

    ids: np.ndarray
    prompt_len: int  # the first `prompt_len` ids were the prompt, the rest a reply
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The number of leading tokens two id arrays share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def shared_prefix_length(rows: list, minimum: int) -> int:
    """Tokens all rows share, leaving each row at least one token of its own; 0 for fewer than two rows or
    when fewer than `minimum` tokens are shared (not worth a separate pass)."""
    if len(rows) < 2:
        return 0
    length = min(len(r) for r in rows)
    block = np.stack([np.asarray(r[:length], dtype=np.int64) for r in rows])
    diff = np.flatnonzero((block != block[0]).any(axis=0))
    common = min(int(diff[0]) if diff.size else length, length - 1)
    return common if common >= minimum else 0


def kv_bytes_per_token(model) -> int:
    """The KV cache one token costs: 2 x layers x kv_heads x head_dim x the weights' bytes per value."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * next(model.parameters()).element_size()


def plain_kv_layers(model) -> int:
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
def preallocated_layer_class():
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A cache layer that writes new tokens into room allocated up front instead of concatenating: the stock
        layer's torch.cat copies the whole cache at every decode step, a cost that grows with the context. `keys` and
        `values` are views of the filled part."""

        def __init__(
            self, capacity: int, keys: torch.Tensor | None = None, values: torch.Tensor | None = None, filled: int = 0
        ):
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


def run_prefix(model, ids: np.ndarray) -> CachedSequence:
    """The KV of `ids` run once through `model` (a causal LM or its decoder stack), as a batch-1 sequence."""
    device = next(model.parameters()).device
    cache = model(input_ids=torch.as_tensor(ids, device=device)[None], use_cache=True).cache
    return CachedSequence(
        ids, len(ids), [layer.keys[0] for layer in cache.layers], [layer.values[0] for layer in cache.layers]
    )


class FrozenPrefixes:
    """`run_prefix` with memory, for a model whose weights stay fixed while this lives (OPCD's teacher, the
    start-of-cycle policy): a prefix run before is not run again. Reusing a prefix's KV is exact: the KV of a token
    depends only on the weights and the tokens up to it. Kept up to `max_bytes` of KV (the newest always), the
    least recently used dropped first: a cycle's steps share a handful of prefixes, one per lesson context."""

    def __init__(self, max_bytes: int = 64 << 20):
        self.max_bytes = max_bytes
        self._kept: OrderedDict[tuple[int, bytes], CachedSequence] = OrderedDict()
        self.hits = 0

    def __call__(self, model, ids: np.ndarray) -> CachedSequence:
        key = (id(model), np.asarray(ids, dtype=np.int64).tobytes())
        kept = self._kept.get(key)
        if kept is not None:
            self.hits += 1
            self._kept.move_to_end(key)
            return kept
        kept = self._kept[key] = run_prefix(model, ids)
        while len(self._kept) > 1 and self.nbytes > self.max_bytes:
            self._kept.popitem(last=False)
        return kept

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for seq in self._kept.values() for t in (*seq.keys, *seq.values))


def batched_cache(sources: list[CachedSequence | None], cached: list[int], capacity: int, layers: int):
    """A fresh cache with room for `capacity` tokens per row, holding every row's first `cached[i]` KV
    positions of `sources[i]` left-padded to the widest (the padding is masked out); the stored tensors are
    only read, so one source may serve several rows and later calls."""
    from transformers import DynamicCache

    layer_class = preallocated_layer_class()
    width = max(cached)
    some = next((s for s in sources if s is not None), None)
    if some is None:
        built = [layer_class(capacity) for _ in range(layers)]
    else:
        built = []
        for layer in range(layers):
            ref = some.keys[layer]
            keys = ref.new_zeros((len(sources), ref.shape[0], capacity, ref.shape[2]))
            values = torch.zeros_like(keys)
            for i, (source, c) in enumerate(zip(sources, cached)):
                if c:
                    keys[i, :, width - c : width] = source.keys[layer][:, :c]
                    values[i, :, width - c : width] = source.values[layer][:, :c]
            built.append(layer_class(capacity, keys, values, width))
    cache = DynamicCache()
    cache.layers = built
    return cache


@functools.cache
def _read_only_layer_class():
    from transformers.cache_utils import DynamicLayer

    class ReadOnlyPrefixLayer(DynamicLayer):
        """A fixed prefix's KV: `update` returns the prefix followed by the call's own keys and values and keeps
        nothing, so a call is a pure function of its inputs (a checkpointed layer's recompute sees what its
        forward saw)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            self.lazy_initialization(keys, values)
            self.keys, self.values = keys, values

        def update(self, key_states, value_states, *args, **kwargs):
            return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    return ReadOnlyPrefixLayer


def read_only_cache(prefix: CachedSequence, rows: int):
    """`prefix`'s KV as a cache that `rows` rows read (views, not copies) and no call extends: each layer joins it
    to the call's own keys and values while it runs, so the rows' copies of the prefix never all exist at once."""
    from transformers import DynamicCache

    layer_class = _read_only_layer_class()
    cache = DynamicCache()
    cache.layers = [
        layer_class(k[None].expand(rows, -1, -1, -1), v[None].expand(rows, -1, -1, -1))
        for k, v in zip(prefix.keys, prefix.values)
    ]
    return cache


def read_only_prefix(decoder, ids, rows: int):
    """The KV of the token prefix `ids` (one sequence; gradients flow through it when enabled), as a cache that `rows`
    rows read (views, not copies) and no call extends (`read_only_cache`). The prefix runs with its layers as they
    are, not checkpointed: a checkpointed layer would drop the cache its output is."""
    with _checkpointing_off(decoder):
        prefix = run_prefix(decoder, np.asarray(ids, dtype=np.int64))
    return read_only_cache(prefix, rows)


def checkpoint_keeps_read_only_cache() -> bool:
    """Whether this transformers lets a gradient-checkpointed layer keep a cache it only reads (its
    `_can_checkpoint_with_cache`); without it such a layer runs as if there were no cache."""
    from transformers import modeling_layers

    layer = getattr(modeling_layers, "GradientCheckpointingLayer", None)
    return layer is not None and hasattr(layer, "_can_checkpoint_with_cache")


@contextlib.contextmanager
def reading_cache_under_checkpointing(decoder) -> Iterator[None]:
    """Within the block, `decoder`'s checkpointed layers keep the cache they are given (a `read_only_prefix`)."""
    layers = [m for m in decoder.modules() if hasattr(type(m), "_can_checkpoint_with_cache")]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in layers:
            vars(m).pop("_can_checkpoint_with_cache", None)


@contextlib.contextmanager
def _checkpointing_off(decoder) -> Iterator[None]:
    switched = [m for m in decoder.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in switched:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in switched:
            m.gradient_checkpointing = True
