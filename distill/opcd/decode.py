"""A lean decode loop for OPCD's merged sampler: the same tokens as `generate`, with less work per token.

On CPU a decode step of SmolLM2-135M at batch 4 spends about half its time outside the matmuls: `generate`'s
per-step bookkeeping, the model's module calls and per-step mask building, and the dynamic cache's growing
concatenation of every layer's keys and values. `lean_generate` runs the prompt through the model once, as
`generate` does, then decodes with a plain loop over the layers: the keys and values written in place into a
cache allocated once for the whole response, the attention mask and rotary tables taken per step from tensors
built once. Each layer computes what the model's own layer computes, op for op (the same RMSNorm, rotary,
attention function and projections; the projections called as the model's modules, so the merged sampler's
packed weights serve both paths): on SmolLM2 the logits are bit-identical to `generate`'s, and a seeded draw
gives the same tokens (tests/distill/opcd/test_opcd_decode.py). Decode forward at batch 4, 2 threads: 21 against
27 ms (bench/RESULTS.md, "Packed weights, a lean decode loop").

Only the architectures whose layer it mirrors (`lean_decoding_supported`: Llama and Qwen2 with full attention,
SiLU MLPs, SDPA, plain `nn.Linear` projections, on CPU); anything else samples with `generate`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_TYPES = ("llama", "qwen2")


def _attention_function():
    try:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:  # a transformers without it: `generate` samples
        return None
    return sdpa_attention_forward


def lean_decoding_supported(causal_lm) -> bool:
    """Whether `lean_generate` reproduces `causal_lm`'s decode: a Llama or Qwen2 model on CPU whose every layer is
    the stock one (full attention through SDPA, a SiLU-gated MLP, plain linear projections: no adapter layers,
    which the merged sampler's copy never has)."""
    config = getattr(causal_lm, "config", None)
    body = getattr(causal_lm, "model", None)
    if config is None or body is None or getattr(config, "model_type", None) not in _TYPES:
        return False
    if causal_lm.device.type != "cpu" or _attention_function() is None:
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
    """The model's RMSNorm, op for op (LlamaRMSNorm and Qwen2RMSNorm compute the same)."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@torch.no_grad()
def lean_generate(
    causal_lm,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    draw: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
) -> torch.Tensor:
    """The (B, n <= max_new_tokens) tokens `generate(do_sample=False, logits_processor=[draw])` returns after the
    left-padded prompts `ids` (with their attention `mask`): `draw(ids so far, float32 scores)` gives scores whose
    argmax is the next token (`InverseCDFSampler`); a row that has ended (an EOS) is padded with `pad_id`, and
    the loop stops when every row has ended."""
    attention = _attention_function()
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
    visible = torch.ones((rows, 1, 1, total), dtype=torch.bool, device=ids.device)
    visible[:, 0, 0, :width] = mask.bool()
    next_position = positions[:, -1:] + 1
    eos = torch.tensor(eos_ids, device=ids.device)
    unfinished = torch.ones(rows, dtype=torch.bool, device=ids.device)
    head = causal_lm.get_output_embeddings()
    sequence = ids
    generated = []
    for step in range(max_new_tokens):
        tokens = draw(sequence, logits.to(dtype=torch.float32, copy=True)).argmax(-1)
        tokens = torch.where(unfinished, tokens, torch.full_like(tokens, pad_id))
        generated.append(tokens)
        unfinished &= ~torch.isin(tokens, eos)
        if step + 1 == max_new_tokens or not bool(unfinished.any()):
            break
        sequence = torch.cat([sequence, tokens[:, None]], dim=-1)
        length = width + step + 1  # the cache's keys after this token's are written
        hidden = body.embed_tokens(tokens[:, None])
        cos, sin = body.rotary_emb(hidden, next_position + step)
        cos, sin = cos[:, None], sin[:, None]
        step_mask = visible[..., :length] if padded else None
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms_norm(layer.input_layernorm, hidden)
            q = _rotate(attn.q_proj(x).view(rows, 1, heads, head_dim).transpose(1, 2), cos, sin)
            k = _rotate(attn.k_proj(x).view(rows, 1, kv_heads, head_dim).transpose(1, 2), cos, sin)
            keys[i, :, :, length - 1 : length] = k
            values[i, :, :, length - 1 : length] = attn.v_proj(x).view(rows, 1, kv_heads, head_dim).transpose(1, 2)
            o, _ = attention(attn, q, keys[i, :, :, :length], values[i, :, :, :length], step_mask, scaling=attn.scaling)
            hidden = hidden + attn.o_proj(o.reshape(rows, 1, -1).contiguous())
            x = _rms_norm(layer.post_attention_layernorm, hidden)
            hidden = hidden + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
        logits = head(_rms_norm(body.norm, hidden)[:, -1].contiguous())
    return torch.stack(generated, dim=1)
