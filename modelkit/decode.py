"""A lean decode loop for OPCD's merged sampler: the same tokens as `generate`, with less work per token.

On CPU a decode step of SmolLM2-135M at batch 4 spends about half its time outside the matmuls: `generate`'s
per-step bookkeeping, the model's module calls and per-step mask building, and the dynamic cache's growing
concatenation of every layer's keys and values. `lean_generate` runs the prompt through the model once, as
`generate` does, then decodes with a plain loop over the layers: the keys and values written in place into a
cache allocated once for the whole response, the attention mask and rotary tables taken per step from tensors
built once. Each layer computes the values the model's own layer computes, to the bit, in fewer ops: the same
RMSNorm (in place where it made a new tensor), the projections called as the model's modules (so the merged
sampler's packed weights serve both paths), rotary as `x * cos + x.roll(half) * signed_sin` (what
`rotate_half(x) * sin` computes), the SDPA call transformers' attention function makes for one position (an
additive mask built once per step where it passes a boolean one that SDPA converts in every layer), and the
token drawn straight from the sampler (`InverseCDFSampler.sample`), not found again by an argmax over its one-hot
scores. On SmolLM2 the logits are bit-identical to `generate`'s and a seeded draw gives the same tokens
(tests/modelkit/test_decode.py); the time per token falls with the bookkeeping left out (timings in
bench/RESULTS.md, "Packed weights, a lean decode loop").

Only the architectures whose layer it mirrors (`lean_decoding_supported`: Llama and Qwen2 with full attention,
SiLU MLPs, SDPA, plain `nn.Linear` projections, on CPU); anything else samples with `generate`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_TYPES = ("llama", "qwen2")


def lean_decoding_supported(causal_lm) -> bool:
    """Whether `lean_generate` reproduces `causal_lm`'s decode: a Llama or Qwen2 model on CPU whose every layer is
    the stock one (full attention through SDPA, a SiLU-gated MLP, plain linear projections: no adapter layers,
    which the merged sampler's copy never has)."""
    config = getattr(causal_lm, "config", None)
    body = getattr(causal_lm, "model", None)
    if config is None or body is None or getattr(config, "model_type", None) not in _TYPES:
        return False
    if causal_lm.device.type != "cpu":
        return False
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "hidden_act", None) != "silu":
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    for layer in getattr(body, "layers", ()):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")
        for owner, projections in zip((attn, mlp), names):
            if owner is None or any(type(getattr(owner, n, None)) is not torch.nn.Linear for n in projections):
                return False
    return hasattr(body, "rotary_emb") and hasattr(body, "norm") and causal_lm.get_output_embeddings() is not None


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm, op for op (LlamaRMSNorm and Qwen2RMSNorm compute the same), in place where the op
    made a new tensor."""
    dtype = x.dtype
    x = x.to(torch.float32)
    scale = x.pow(2).mean(-1, keepdim=True).add_(norm.variance_epsilon).rsqrt_()
    x = x.mul_(scale) if dtype != torch.float32 else x * scale  # a float32 `x` is the caller's: not in place
    return norm.weight * x.to(dtype)


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask, scaling: float) -> torch.Tensor:
    """One position's attention for the (rows, heads, 1, dim) query; its output read as (rows, 1, heads * dim) is
    the model's, head by head. The SDPA call transformers' `sdpa_attention_forward` makes for one query position
    (grouped-query attention as SDPA's `enable_gqa` without a mask and heads of at most 256 values, else the query's
    heads folded onto the key heads), without its per-call checks."""
    rows, heads, _, dim = q.shape
    groups = heads // keys.shape[1]
    if groups > 1 and mask is None and dim <= 256:  # transformers' condition for `enable_gqa` on CPU
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values, scale=scaling, enable_gqa=True)
    if groups > 1:
        q = q.reshape(rows, heads // groups, groups, dim)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scaling)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """`sin` with its first half negated: `rotate_half(x) * sin` is `x.roll(half) * _signed_sin(sin)`, exactly
    (a negation is exact, and a product's sign does not change its rounding)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The model's `x * cos + rotate_half(x) * sin`, in four ops instead of seven (the same values to the bit)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


@torch.no_grad()
def lean_generate(
    causal_lm,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    draw: Callable[[torch.Tensor], torch.Tensor],
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
) -> torch.Tensor:
    """The (B, n <= max_new_tokens) tokens `generate(do_sample=False, logits_processor=[sampler])` returns after
    the left-padded prompts `ids` (with their attention `mask`), where `draw` is that sampler's `sample`: the (B,)
    next tokens from (B, vocabulary) float32 scores (`InverseCDFSampler.sample`). A row that has ended (an EOS) is
    padded with `pad_id`, and the loop stops when every row has ended."""
    body = causal_lm.model
    config = causal_lm.config
    rows, width = ids.shape
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate numbers a left-padded row
    out = causal_lm(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    layers = body.layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = config.num_key_value_heads
    total = width + max_new_tokens
    prompt_cache = out.get("cache")  # `past_key_values` in older transformers releases
    logits, prompt_cache = out.logits[:, -1], out.get("past_key_values") if prompt_cache is None else prompt_cache
    del out
    kv_dtype = prompt_cache.layers[0].keys.dtype
    keys = torch.empty((len(layers), rows, kv_heads, total, head_dim), dtype=kv_dtype, device=ids.device)
    values = torch.empty_like(keys)
    for i, layer_cache in enumerate(prompt_cache.layers):
        keys[i, :, :, :width] = layer_cache.keys
        values[i, :, :, :width] = layer_cache.values
    del prompt_cache
    padded = not bool(mask.all())  # the model passes no mask to SDPA when no row is padded: neither does this
    # Additive, where the model passes a boolean mask: SDPA turns a boolean one into this in every layer's call
    additive_mask = torch.zeros((rows, 1, 1, total), dtype=kv_dtype, device=ids.device)
    additive_mask[:, 0, 0, :width].masked_fill_(mask == 0, float("-inf"))
    layer_keys, layer_values = keys.unbind(0), values.unbind(0)
    next_position = positions[:, -1:] + 1
    eos = torch.tensor(eos_ids, device=ids.device)
    unfinished = torch.ones(rows, dtype=torch.bool, device=ids.device)
    head = causal_lm.get_output_embeddings()
    generated = []
    for step in range(max_new_tokens):
        tokens = draw(logits.float())
        tokens = torch.where(unfinished, tokens, torch.full_like(tokens, pad_id))
        generated.append(tokens)
        unfinished &= ~torch.isin(tokens, eos)
        if step + 1 == max_new_tokens or not bool(unfinished.any()):
            break
        length = width + step + 1  # the cache's keys after this token's are written
        hidden = body.embed_tokens(tokens[:, None])
        cos, sin = body.rotary_emb(hidden, next_position + step)
        cos, signed_sin = cos[:, None], _signed_sin(sin[:, None])
        step_mask = additive_mask[..., :length] if padded else None
        for layer, layer_k, layer_v in zip(layers, layer_keys, layer_values):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms_norm(layer.input_layernorm, hidden)
            # (rows, 1, heads * dim) read as (rows, heads, 1, dim): the model's view and transpose, for one position
            q = _rotate(attn.q_proj(x).view(rows, heads, 1, head_dim), cos, signed_sin)
            k = _rotate(attn.k_proj(x).view(rows, kv_heads, 1, head_dim), cos, signed_sin)
            layer_k.narrow(2, length - 1, 1).copy_(k)
            layer_v.narrow(2, length - 1, 1).copy_(attn.v_proj(x).view(rows, kv_heads, 1, head_dim))
            o = _attend(q, layer_k.narrow(2, 0, length), layer_v.narrow(2, 0, length), step_mask, attn.scaling)
            hidden = hidden + attn.o_proj(o.reshape(rows, 1, heads * head_dim))
            x = _rms_norm(layer.post_attention_layernorm, hidden)
            hidden = hidden + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        logits = head(_rms_norm(body.norm, hidden)[:, -1].contiguous())
    return torch.stack(generated, dim=1)
