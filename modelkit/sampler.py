"""Where OPCD's samples come from: one response per prompt, drawn from the student's merged weights.

Sampling is the largest part of an OPCD step, and unmerged LoRA costs extra matmuls at every decoded token
(bench/RESULTS.md, "OPCD training", has the step times). So the student samples from a
copy of the model whose weights are W + BA, written in just before sampling: in bf16 where the device computes bf16
natively (a GPU, an AVX-512 CPU: faster generation), in fp32 where it does not (an AVX2 CPU emulates bf16, slower),
as `OPCDConfig.sampler: auto` picks (`fast_bf16`), or in the dtype the config names. The copy's parameters are
emptied right after, so it never adds to the memory peak of the training half of the step (refilling costs one cast
of the weights). `sampler: live` samples from the training model itself: no extra memory, slower.

`sample_responses` is plain ancestral sampling at the config temperature (no top-k/top-p: the loss is defined
on the student's own distribution), each response cut after its first EOS; a token is drawn by `InverseCDFSampler`
(one uniform number per row, where `torch.multinomial` draws one per vocabulary entry, work that grows with the
vocabulary at every token), as the transformers backend draws.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path

import torch

from modelkit.decode import lean_decoding_supported, lean_generate


class MergedSampler:
    """A frozen copy of the student's modules whose parameters hold memory only inside `weights_of(student)`."""

    def __init__(self, model, dtype: torch.dtype):
        """`model`: the plain causal LM, before any adapter is attached to it."""
        self.dtype = dtype
        memo = {
            id(p): torch.nn.Parameter(torch.empty(0, dtype=dtype, device=p.device), requires_grad=False)
            for p in model.parameters()
        }
        self.model = copy.deepcopy(model, memo).eval()  # buffers (rotary frequencies) stay in full precision
        self.packs = packs_bf16_linears(dtype, model.device)  # decided once: the CPU's flags do not change

    @torch.no_grad()
    def _sources(self, student_lm) -> Iterator[tuple[torch.nn.Parameter, torch.Tensor]]:
        """(copy parameter, the student's current value for it, LoRA merged in) pairs."""
        modules = dict(student_lm.named_modules())
        params = dict(student_lm.named_parameters())
        for name, param in self.model.named_parameters():
            module_name, _, leaf = name.rpartition(".")
            module = modules.get(module_name)
            if leaf == "weight" and "default" in getattr(module, "lora_A", {}):
                yield param, _merged_weight(module)
            elif hasattr(module, "base_layer"):  # a LoRA-wrapped layer's other parameters (a bias) sit in its base
                yield param, getattr(module.base_layer, leaf)
            else:
                yield param, params[name]

    @contextlib.contextmanager
    def weights_of(self, student_lm) -> Iterator[torch.nn.Module]:
        """The copy, filled with `student_lm`'s current merged weights for the duration of the block; on a CPU
        that packs bf16 matmuls (`packs_bf16_linears`) its linear layers compute from packed weights."""
        with torch.no_grad():
            for param, value in self._sources(student_lm):
                param.data = value.detach().to(self.dtype)  # aliases fp32 weights that need no merge: no copy
        packed = pack_linears(self.model) if self.packs else []
        try:
            yield self.model
        finally:
            for module in packed:
                del module.forward
            for param in self.model.parameters():
                param.data = torch.empty(0, dtype=self.dtype, device=param.device)


def _merged_weight(module) -> torch.Tensor:
    """A LoRA layer's W + ΔW (ΔW = B @ A x scaling, peft's `get_delta_weight`), the sum to the bit of theirs: for a
    float32 linear layer computed in place in the product's own buffer (two passes over the weight where three
    make a new tensor each; 210 such weights a step on SmolLM2), else as peft computes it."""
    base = module.base_layer.weight
    lora_a, lora_b = module.lora_A["default"].weight, module.lora_B["default"].weight
    if (
        isinstance(module.base_layer, torch.nn.Linear)
        and not getattr(module, "fan_in_fan_out", False)
        and (base.dtype == lora_a.dtype == lora_b.dtype == torch.float32)
    ):
        return (lora_b @ lora_a).mul_(module.scaling["default"]).add_(base)  # x + y == y + x, to the bit
    return base + module.get_delta_weight("default")


def packs_bf16_linears(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether the merged sampler's linear layers compute from oneDNN's packed weights: bf16 on a CPU with
    native bf16 (`fast_bf16`) and a torch that has the packing ops. A bf16 `F.linear` on CPU reorders its
    weight into oneDNN's blocked layout at every call; packed once, the decode forward skips that reorder and
    gives bit-identical logits (timings in bench/RESULTS.md, "Packed weights, a lean decode loop")."""
    return (
        dtype == torch.bfloat16
        and torch.device(device).type == "cpu"
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and fast_bf16(device)
    )


def pack_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Gives every bf16 `nn.Linear` of `model` a forward that computes from a packed copy of its weight, and
    returns those modules (`del module.forward` restores the class's). A weight no other module uses is emptied
    once packed, so the packed copy replaces it rather than adding to it; a tied weight (the output head's, shared
    with the embedding) stays."""
    users: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            users[id(param)] = users.get(id(param), 0) + 1
    packed = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, torch.nn.Linear) or weight is None or weight.dtype != torch.bfloat16:
            continue
        module.forward = _packed_forward(torch.ops.mkldnn._reorder_linear_weight(weight.detach()), module)
        if users[id(weight)] == 1:
            weight.data = torch.empty(0, dtype=weight.dtype, device=weight.device)
        packed.append(module)
    return packed


def _packed_forward(weight: torch.Tensor, module: torch.nn.Linear):
    bias = module.bias

    def forward(x: torch.Tensor) -> torch.Tensor:  # the op takes any leading dimensions
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    return forward


def fast_bf16(device: torch.device | str) -> bool:
    """Whether `device` computes bf16 matmuls natively, so that a bf16 sampler beats an fp32 one: a CUDA device
    that supports bf16, or a CPU with the AVX-512 (or AMX) kernels oneDNN uses for bf16. On an AVX2-only CPU
    bf16 is emulated, and both prefill and decode run slower in bf16 than in fp32 (bench/sampler.py,
    bench/RESULTS.md)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if check is not None:
        try:
            return bool(check())
        except RuntimeError:
            pass
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def sampler_dtype(choice: str, device: torch.device | str) -> torch.dtype:
    """The merged sampler's dtype for an `OPCDConfig.sampler` value other than `live`."""
    if choice == "auto":
        return torch.bfloat16 if fast_bf16(device) else torch.float32
    return torch.bfloat16 if choice == "merged-bf16" else torch.float32


class InverseCDFSampler:
    """Samples the next token from softmax(scores / temperature), restricted to the top-p nucleus, as a logits
    processor: it returns scores that are 0 at the drawn token and -inf elsewhere, so generate's greedy step
    picks it. One uniform number per row and a search in the cumulative distribution replace
    `torch.multinomial`, which draws a random number per vocabulary entry: over a vocabulary of tens of thousands
    of tokens, a visible share of a CPU decode step. The uniform numbers come from torch's global generator,
    or with `generators` (one CPU `torch.Generator` per row) each row's from its own: then a row's tokens depend on
    its seed and its scores alone, not on the rows beside it or on what drew before (how a run replays), and are the
    same on any device. `logprobs` keeps the drawn tokens' log-probabilities under the tempered,
    nucleus-renormalised distribution, one (batch,) tensor per step."""

    def __init__(self, temperature: float, top_p: float = 1.0, generators: list[torch.Generator] | None = None):
        self.temperature, self.top_p = temperature, top_p
        self.generators = generators
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tokens = self.sample(scores)[:, None]
        return torch.full_like(scores, float("-inf")).scatter_(-1, tokens, 0.0)

    def sample(self, scores: torch.Tensor) -> torch.Tensor:
        """The (batch,) tokens drawn from (batch, vocabulary) `scores`, their log-probabilities kept (what the
        processor's one-hot scores make `generate` pick, without building and searching them)."""
        logp = (scores.float() / self.temperature).log_softmax(-1)
        if self.top_p < 1.0:
            sorted_logp, order = logp.sort(-1, descending=True)
            mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()
            sorted_logp = sorted_logp.masked_fill(mass_before >= self.top_p, float("-inf"))  # keeps the top token
            logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp).log_softmax(-1)
        cdf = logp.exp().cumsum(-1)
        u = self._uniforms(cdf.shape[0], cdf.device) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
        self.logprobs.append(logp.gather(-1, tokens).squeeze(-1))
        return tokens.squeeze(-1)

    def _uniforms(self, rows: int, device: torch.device) -> torch.Tensor:
        """(rows, 1) uniform numbers: from the global generator, or one from each row's own."""
        if self.generators is None:
            return torch.rand(rows, 1, device=device)
        assert len(self.generators) == rows, f"{len(self.generators)} generators for {rows} rows"
        return torch.cat([torch.rand(1, 1, generator=g) for g in self.generators]).to(device)


@contextlib.contextmanager
def folded_head(causal_lm) -> Iterator[None]:
    """For the block, `causal_lm`'s output head gets its input made contiguous first.

    `generate`'s prefill keeps only the last position's hidden state, `hidden[:, -1:]`: a (B, 1, H) slice that is
    not contiguous over its batch. A matmul that needs no gradient does not fold such an input into one (B, H) mm:
    it broadcasts the (H, V) head weight to (B, H, V) and copies it for a bmm, B x V x H values (B = 4 on
    SmolLM2: 113M, ~450 MB in float32, at every prefill). Folded, the same logits cost one small mm."""
    head = causal_lm.get_output_embeddings()
    if head is None:
        yield
        return
    handle = head.register_forward_pre_hook(_contiguous_input)
    try:
        yield
    finally:
        handle.remove()


def _contiguous_input(_module, args):
    return (args[0].contiguous(), *args[1:]) if args and isinstance(args[0], torch.Tensor) else None


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as one (rows, longest) batch padded on the left with `pad_id`, and its attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


@torch.no_grad()
def sample_responses(
    causal_lm,
    prompts: list[list[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    lean: bool = True,
) -> list[list[int]]:
    """One sample per prompt (token ids) at `temperature`, cut after the first EOS. `lean`: decode with
    `modelkit.decode.lean_generate` where the model is one it mirrors (the same tokens, less work per token),
    else with `generate`."""
    ids, mask = left_padded(prompts, pad_id)
    width = ids.shape[1]
    was_training = causal_lm.training
    causal_lm.eval()
    from transformers import LogitsProcessorList

    ids, mask = ids.to(causal_lm.device), mask.to(causal_lm.device)
    draw = InverseCDFSampler(temperature)
    with folded_head(causal_lm):
        if lean and lean_decoding_supported(causal_lm):
            out = lean_generate(
                causal_lm, ids, mask, draw=draw.sample, max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id
            )
        else:
            out = causal_lm.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,  # the draw is the processor's: its one-hot scores make the greedy step pick it
                logits_processor=LogitsProcessorList([draw]),
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_ids,
                pad_token_id=pad_id,
            )[:, width:]
    causal_lm.train(was_training)
    responses = []
    for row in out.tolist():
        cut = next((i for i, tok in enumerate(row) if tok in eos_ids), len(row) - 1)
        responses.append(row[: cut + 1])
    return responses
