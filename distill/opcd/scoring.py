"""The forward passes of an OPCD step: final hidden states at the positions that predict each response token.

The loss (`distill.opcd.losses.chunked_topk_divergence`) is computed from hidden states and the output head in
sequence chunks, so the (B, T, V) logits of the student and the teacher are never held at once; this module
lays out a batch of (prompt, response) rows for one decoder pass and returns those hidden states.

The teacher's prompts of a batch usually start with the same tokens (the system prompt and, when every sample
got the same lesson pool, the lessons): that prefix is run once and its KV cache reused for every row
(`modelkit.prefix_kv`, the same splice the transformers backend uses for its slots), so the teacher forward
runs only each row's own tokens. The teacher is frozen for the whole cycle, so a prefix its steps share is run once
per cycle (`FrozenPrefixes`). The student's weights change every step: the prefix its rows share (the system
prompt) runs once per step, gradients flowing through its KV (`modelkit.prefix_kv.read_only_prefix`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from modelkit.choice import lm_parts
from modelkit.prefix_kv import (
    FrozenPrefixes,
    plain_kv_layers,
    read_only_cache,
    read_only_prefix,
    reading_cache_under_checkpointing,
    run_prefix,
)


def response_hidden(
    causal_lm,
    prompts: list[list[int]],
    responses: list[list[int]],
    *,
    pad_id: int,
    shared_prefix: int = 0,
    prefixes: FrozenPrefixes | None = None,
) -> torch.Tensor:
    """Final hidden states (B, R, H) at the positions that predict each response token.

    Layout per row: [shared prefix][left padding][rest of the prompt][response][right padding]. When
    `shared_prefix` > 0 (a model whose cache can be spliced) the prefix is run once and every row reads its KV;
    with gradients enabled (the student) they flow through that KV into the prefix's own positions, so the hidden
    states and their gradients are those of the rows run whole, a checkpointed model's too. `prefixes` (a frozen
    model's, no gradients): run once for as long as they live.
    """
    decoder, _ = lm_parts(causal_lm)
    device = causal_lm.device
    batch, longest = len(prompts), max(len(r) for r in responses)
    rests = [p[shared_prefix:] for p in prompts]
    assert all(rests), "every row must keep at least one prompt token after the shared prefix"
    width = max(len(r) for r in rests)
    ids = torch.full((batch, width + longest), pad_id, dtype=torch.long)
    mask = torch.zeros(batch, shared_prefix + width + longest, dtype=torch.long)
    mask[:, :shared_prefix] = 1
    for row, (rest, response) in enumerate(zip(rests, responses)):
        ids[row, width - len(rest) : width] = torch.tensor(rest)
        ids[row, width : width + len(response)] = torch.tensor(response)
        mask[row, shared_prefix + width - len(rest) : shared_prefix + width + len(response)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared_prefix:]
    cache = None
    if shared_prefix:
        assert plain_kv_layers(causal_lm), f"{type(causal_lm).__name__}'s cache cannot be spliced; use shared_prefix=0"
        prefix_ids = np.asarray(prompts[0][:shared_prefix], dtype=np.int64)
        if torch.is_grad_enabled():
            assert prefixes is None, "kept prefixes are a frozen model's; a model that trains runs its prefix anew"
            cache = read_only_prefix(decoder, prefix_ids, batch)
        else:
            cache = read_only_cache((prefixes or run_prefix)(decoder, prefix_ids), batch)  # every row reads one copy
    with reading_cache_under_checkpointing(decoder) if cache is not None else contextlib.nullcontext():
        out = decoder(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            cache=cache,
            use_cache=cache is not None,
        )
    return out.last_hidden_state[:, width - 1 : width - 1 + longest]


def pad_responses(responses: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets (B, R) right-padded with `pad_id`, mask (B, R): 1 on response tokens)."""
    longest = max(len(r) for r in responses)
    targets = torch.full((len(responses), longest), pad_id, dtype=torch.long)
    mask = torch.zeros(len(responses), longest)
    for row, response in enumerate(responses):
        targets[row, : len(response)] = torch.tensor(response)
        mask[row, : len(response)] = 1
    return targets.to(device), mask.to(device)
