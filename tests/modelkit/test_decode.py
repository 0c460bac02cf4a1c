"""OPCD's lean decode loop draws what `generate` draws: the same tokens and the same per-step log-probabilities (to
the bit) from the same seed, with left-padded rows, rows that end early, grouped-query attention, Llama and Qwen2, float32
and bf16; models it does not mirror keep `generate`."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

from agent_runtime.testing import tiny_model_and_tokenizer
from modelkit.decode import lean_decoding_supported, lean_generate
from modelkit.sampler import InverseCDFSampler, left_padded, sample_responses


def _model(arch: str, dtype: torch.dtype):
    model, tok = tiny_model_and_tokenizer(arch, hidden_size=64, layers=3, heads=4, kv_heads=2, seed=1)
    return model.to(dtype).eval(), tok


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [(5, 9, 3, 7), (6, 6, 6, 6)], ids=["padded", "unpadded"])
def test_the_lean_loop_draws_what_generate_draws(arch, dtype, lengths):
    model, tok = _model(arch, dtype)
    assert lean_decoding_supported(model)
    prompts = [[(7 * row + 3 * i) % 90 + 5 for i in range(n)] for row, n in enumerate(lengths)]
    ids, mask = left_padded(prompts, tok.pad_token_id)
    eos = list(range(7, len(tok), 5))  # one token in five ends a row: rows end at different steps, some not at all
    runs = {}
    for lean in (False, True):
        draw = InverseCDFSampler(temperature=0.9)
        torch.manual_seed(11)
        with torch.no_grad():
            if lean:
                out = lean_generate(
                    model, ids, mask, draw=draw.sample, max_new_tokens=12, eos_ids=eos, pad_id=tok.pad_token_id
                )
            else:
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=False,
                    logits_processor=LogitsProcessorList([draw]),
                    max_new_tokens=12,
                    eos_token_id=eos,
                    pad_token_id=tok.pad_token_id,
                )[:, ids.shape[1] :]
        runs[lean] = (out, draw.logprobs)
    (stock, stock_logp), (lean_out, lean_logp) = runs[False], runs[True]
    assert torch.equal(lean_out, stock)
    assert len(lean_logp) == len(stock_logp) == stock.shape[1]
    assert all(torch.equal(a, b) for a, b in zip(lean_logp, stock_logp))  # the same logits, to the bit
    ended = [next((i for i, t in enumerate(row) if t in eos), None) for row in stock.tolist()]
    assert any(e is not None and e < stock.shape[1] - 1 for e in ended), (
        stock.tolist()
    )  # some row ended early and was padded


def test_sample_responses_gives_the_same_samples_lean_or_not():
    model, tok = _model("llama", torch.float32)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    kwargs = {"temperature": 0.7, "max_new_tokens": 8, "eos_ids": [tok.eos_token_id], "pad_id": tok.pad_token_id}
    samples = {}
    for lean in (False, True):
        torch.manual_seed(4)
        samples[lean] = sample_responses(model, prompts, lean=lean, **kwargs)
    assert samples[True] == samples[False]
    assert all(1 <= len(r) <= 8 for r in samples[True])


def test_models_the_loop_does_not_mirror_keep_generate():
    from peft import LoraConfig, get_peft_model

    model, _ = _model("llama", torch.float32)
    assert lean_decoding_supported(model)
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert not lean_decoding_supported(wrapped.base_model.model)  # adapter layers: the sampler's copy is merged
    eager, _ = tiny_model_and_tokenizer("llama", hidden_size=32, layers=1, heads=2)
    eager.config._attn_implementation = "eager"
    assert not lean_decoding_supported(eager)
    assert not lean_decoding_supported(torch.nn.Linear(2, 2))
