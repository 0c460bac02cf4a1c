"""How OPCD's sampler (and the transformers backend) draws: from the tempered distribution, one uniform number a
row; the output head during `generate` gives the same logits without a per-row copy of the head's weight."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agent_runtime.testing import tiny_model_and_tokenizer
from distill.opcd.losses import chunked_topk_divergence
from modelkit import sampler as sampler_module
from modelkit.sampler import InverseCDFSampler, folded_head, pack_linears, packs_bf16_linears, sample_responses


class _Largest(TorchDispatchMode):
    """The element count of the largest tensor any op produced while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def _model():
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer("llama", hidden_size=64, layers=2, heads=4)
    return model.eval(), tok


def test_the_head_under_folded_head_gives_the_stock_logits_from_a_batch_sliced_input():
    model, _ = _model()
    head = model.get_output_embeddings()
    hidden = torch.randn(4, 7, head.in_features)
    last = hidden[:, -1:]  # what a prefill keeps: not contiguous over the batch
    assert not last.is_contiguous()
    with torch.no_grad():
        stock = head(last)
        with folded_head(model):
            folded = head(last)
    torch.testing.assert_close(folded, stock, rtol=1e-5, atol=1e-6)
    assert folded.shape == (4, 1, head.out_features)
    assert not head._forward_pre_hooks  # the hook is gone after the block


def test_sampling_never_materialises_the_head_weight_once_per_row():
    model, tok = _model()
    head = model.get_output_embeddings()
    rows = 4
    per_row_copy = rows * head.in_features * head.out_features  # the broadcast (B, H, V) weight an unfolded bmm copies
    prompts = [[5 + i, 6, 7, 8, 9][: 3 + i % 3] for i in range(rows)]
    watch = _Largest()
    torch.manual_seed(1)
    with watch:
        responses = sample_responses(
            model, prompts, temperature=0.7, max_new_tokens=3, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id
        )
    assert len(responses) == rows and all(1 <= len(r) <= 3 for r in responses)
    assert watch.largest < per_row_copy, (watch.largest, per_row_copy)


def test_the_chunked_loss_hands_each_head_a_contiguous_chunk():
    seen: list[bool] = []
    weight = torch.randn(11, 6)

    def head(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.is_contiguous())
        return x @ weight.T

    student = torch.randn(3, 9, 6, requires_grad=True)
    teacher = torch.randn(3, 9, 6)
    mask = torch.ones(3, 9)
    result = chunked_topk_divergence(
        student, teacher, mask, student_head=head, teacher_head=head, k=4, chunk_size=4, backward=False
    )
    assert result.tokens == 27
    assert len(seen) == 6 and all(seen)  # 3 chunks, a student's and a teacher's head call each


def test_inverse_cdf_sampler_draws_from_the_tempered_nucleus():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")])
    rows = 40_000
    torch.manual_seed(0)
    sampler = InverseCDFSampler(temperature=0.7)
    out = sampler(torch.zeros(rows, 1, dtype=torch.long), logits.expand(rows, -1).clone())
    drawn = out.argmax(-1)
    assert torch.isinf(out).sum(-1).eq(5).all() and out.max(-1).values.eq(0).all()  # one-hot choice
    expected = (logits / 0.7).softmax(-1)
    frequencies = torch.bincount(drawn, minlength=6).float() / rows
    assert torch.allclose(frequencies, expected, atol=0.01) and frequencies[5] == 0
    assert torch.allclose(sampler.logprobs[0], expected.log()[drawn], atol=1e-5)

    torch.manual_seed(0)
    nucleus = InverseCDFSampler(temperature=1.0, top_p=0.8)  # p = .61 .22 .14 ...: the nucleus is 3 tokens
    drawn = nucleus(torch.zeros(rows, 1, dtype=torch.long), logits.expand(rows, -1).clone()).argmax(-1)
    p = logits.softmax(-1)[:3]
    frequencies = torch.bincount(drawn, minlength=6).float() / rows
    assert torch.allclose(frequencies[:3], p / p.sum(), atol=0.01) and frequencies[3:].sum() == 0
    assert torch.allclose(nucleus.logprobs[0], (p / p.sum()).log()[drawn], atol=1e-5)


def test_packed_linears_sample_what_the_stock_layers_sample_and_give_their_memory_back():
    """The merged sampler's bf16 linears compute from packed weights where the CPU packs bf16 matmuls: the same
    logits to the bit, the same seeded samples; the class's forward comes back after; a weight only its layer
    uses is emptied once packed (the packed copy replaces it), the output head's, tied to the embedding, stays."""
    if not packs_bf16_linears(torch.bfloat16, "cpu"):
        pytest.skip("this CPU does not compute bf16 natively: the sampler keeps the stock layers")
    model, tok = _model()
    model = model.to(torch.bfloat16)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    kwargs = {"temperature": 0.7, "max_new_tokens": 6, "eos_ids": [tok.eos_token_id], "pad_id": tok.pad_token_id}
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    with torch.no_grad():
        stock = model(input_ids=ids).logits
    torch.manual_seed(3)
    stock_samples = sample_responses(model, prompts, **kwargs)
    head = model.get_output_embeddings()
    layer = model.model.layers[0].mlp.down_proj
    saved = [p.detach().clone() for p in model.parameters()]
    packed = pack_linears(model)
    assert layer in packed and head in packed
    assert layer.weight.numel() == 0 and head.weight.numel() > 0  # the tied head's weight is the embedding's
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, stock)
    torch.manual_seed(3)
    assert sample_responses(model, prompts, **kwargs) == stock_samples
    for module in packed:
        del module.forward
    for param, value in zip(model.parameters(), saved):
        param.data = value
    assert not any("forward" in vars(module) for module in model.modules())
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, stock)


def test_only_a_bf16_sampler_on_a_cpu_with_native_bf16_packs(monkeypatch):
    monkeypatch.setattr(sampler_module, "fast_bf16", lambda device: True)
    assert sampler_module.packs_bf16_linears(torch.bfloat16, "cpu")
    assert not sampler_module.packs_bf16_linears(torch.float32, "cpu")  # fp32 packed kernels round differently
    assert not sampler_module.packs_bf16_linears(torch.bfloat16, "meta")
    monkeypatch.setattr(sampler_module, "fast_bf16", lambda device: False)
    assert not sampler_module.packs_bf16_linears(torch.bfloat16, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_merged_copy_holds_each_base_weight_plus_its_lora_delta_and_leaves_the_student_as_it_was(dtype):
    """`weights_of` writes W + ΔW into the copy (the sum to the bit, cast to the copy's dtype), for every weight an
    adapter wraps, and the student's base and adapter weights are what they were before and after."""
    from peft import LoraConfig, get_peft_model

    from modelkit.sampler import MergedSampler

    model, _ = _model()
    copy_ = MergedSampler(model, dtype)  # built before the adapter is attached, as the trainer builds it
    student = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    torch.manual_seed(5)
    for name, param in student.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.05)  # an adapter that has trained: B is no longer zero
    lm = student.get_base_model()
    before = {name: p.detach().clone() for name, p in lm.named_parameters()}
    wrapped = {n.removesuffix(".base_layer"): m for n, m in lm.named_modules() if hasattr(m, "lora_A")}
    assert len(wrapped) == 4  # q_proj and down_proj of both layers
    with torch.no_grad(), copy_.weights_of(lm) as merged:
        for name, module in wrapped.items():
            expected = (module.base_layer.weight + module.get_delta_weight("default")).to(dtype)
            weight = merged.get_submodule(name).weight
            if weight.numel() == 0:  # packed, its plain copy emptied: the packed layer's output is compared
                x = torch.randn(3, module.base_layer.in_features, dtype=dtype)
                assert torch.equal(merged.get_submodule(name)(x), torch.nn.functional.linear(x, expected))
            else:
                assert torch.equal(weight, expected)
            assert not torch.equal(expected, module.base_layer.weight.to(dtype))  # the delta moved it
        for name, param in merged.named_parameters():  # the rest: the student's own values
            if name.removesuffix(".weight") not in wrapped and param.numel():
                assert torch.equal(param, before[name].to(dtype))
    assert all(torch.equal(p, before[n]) for n, p in lm.named_parameters())
    assert all(p.numel() == 0 for p in copy_.model.parameters())  # released after the block
