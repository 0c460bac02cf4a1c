"""`OPCDConfig`: every knob of one consolidation run, validated (unknown keys are errors).

Defaults follow the paper (arXiv 2602.12275) where it fixes them: top-k 256, one sample per prompt, one
AdamW step per batch at a constant learning rate in 1e-6..5e-6, gradient clip 1.0. The sampling temperature
is 0.6 for math and 0.7 for games in the paper; the default here is the games value. The same config drives
the baselines (`objective`, a name in the registry `distill.opcd.objectives`), so a comparison changes one field.

`processes` only tells the job runner how many ranks to launch; the trainer itself follows whatever
torch.distributed group it runs in, so the same config file serves a laptop and a multi-GPU worker.

System-prompt distillation (the paper's MedMCQA / safety set-ups) is not a separate mode: it is OPCD with a
fixed context string (the system prompt) passed as the context of every sample.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from distill.opcd.losses import Tail
from distill.opcd.objectives import get_objective, list_objectives
from modelkit.config_base import StrictConfig
from modelkit.prefix_kv import MIN_SHARED_PREFIX

Sampler = Literal["auto", "merged-bf16", "merged-fp32", "live"]


class OPCDConfig(StrictConfig):
    """One consolidation run. Field docs say what each knob does and why its default is what it is."""

    objective: str = Field(
        "opcd",
        description="the name of a registered objective (`distill.opcd.objectives`); built in: "
        "opcd: student samples, reverse KL on the student's top-k (the method); "
        "off_policy: teacher samples with the context, forward KL on the teacher's top-k; "
        "sft: teacher samples with the context, cross-entropy on them",
    )
    lr: float = Field(2e-6, gt=0, description="AdamW learning rate, constant (no schedule, no warm-up)")
    weight_decay: float = Field(0.0, ge=0)
    k: int = Field(256, ge=1, description="top-k support of the divergence (k >= vocabulary = exact KL)")
    temperature: float = Field(0.7, gt=0, description="sampling and loss temperature tau")
    tail: Tail = Field(
        "bucket",
        description="the mass outside the top-k: 'bucket' counts it as one more outcome (a true KL, at rest "
        "when the student equals the teacher), 'renormalize' renormalises both sides over the top-k (TRL's SDFT), "
        "'drop' sums over the top-k alone (the paper; not a divergence: it pushes mass into the tail)",
    )
    max_new_tokens: int = Field(256, ge=1, description="longest sampled response; longer ones are cut")
    max_prompt_tokens: int | None = Field(None, ge=1, description="keep only the last N prompt tokens")
    batch_size: int = Field(4, ge=1, description="prompts per optimizer step, one sample each")
    anchor_share: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="with anchor prompts (`OPCDTrainer.train(anchors=...)`): the share of every "
        "batch that they fill, whatever their count (rounded per step so that the running share is exact); None: "
        "they join the prompts and fill batches in proportion to their count",
    )
    micro_batch_size: int = Field(
        8,
        ge=1,
        description="choice objective: prompts per forward pass inside one step (the gradient is accumulated "
        "over them), so a step may see every prompt of a cycle without holding their activations at once",
    )
    micro_batch_tokens: int = Field(
        512,
        ge=1,
        description="choice objective: also at most this many tokens (prompts and their actions) per forward pass, "
        "so that the activations kept for the backward pass stay bounded (~0.8 MB a token for SmolLM2-135M in "
        "float32 without gradient checkpointing); a longer prompt runs alone",
    )
    steps: int = Field(100, ge=0, description="optimizer steps of a run")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="constant (the paper), or cosine decay to a tenth of lr over `steps`"
    )
    warmup_steps: int = Field(0, ge=0, description="steps of linear warm-up from lr/10 before the schedule")
    validation_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of the training prompts held back to validate on (0: none): their exact "
        "KL to the teacher is measured every `eval_every` steps, the run stops after `patience` measurements "
        "without a new best, and the adapter of the best measurement is the one kept",
    )
    eval_every: int = Field(1, ge=1, description="steps between two validation measurements")
    patience: int = Field(
        0, ge=0, description="validation measurements without a new best before the run stops (0: never stop early)"
    )
    min_improvement: float = Field(
        0.01, ge=0, lt=1, description="a validation KL is a new best only below (1 - this) x the best so far"
    )
    grad_clip: float = Field(1.0, gt=0, description="global gradient-norm clip")
    weights_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="dtype of the model's weights and activations while the cycle trains (a LoRA "
        "adapter's own weights stay float32). float32: an 8-step adapter changes each layer's output by less than "
        "bfloat16 resolves, so bf16 acting loses most of what it learned (bench/RESULTS.md); bfloat16 halves the "
        "weights' memory",
    )
    full_finetune: bool = Field(
        False,
        description="train all weights instead of a LoRA adapter (the teacher is "
        "then a frozen copy of the start-of-cycle model: twice the weights in memory)",
    )
    lora_r: int = Field(16, ge=1)
    lora_alpha: float = Field(32.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_target_modules: list[str] | str = Field(
        "all-linear", description="peft target modules: a list of module names, or 'all-linear'"
    )
    gradient_checkpointing: bool = Field(
        True,
        description="recompute the student's activations in the backward pass instead of keeping them: "
        "about half the training memory for one more student forward (cheap next to sampling and the teacher)",
    )
    chunk_size: int = Field(
        32,
        ge=1,
        description="response positions per loss chunk: bounds the logits memory "
        "to about 6 x batch x chunk x vocabulary floats",
    )
    sampler: Sampler = Field(
        "auto",
        description="what the student samples from: a copy with the adapter merged, in bf16 (`merged-bf16`: "
        "fastest on GPUs and CPUs that compute bf16 natively) or fp32 (`merged-fp32`: fastest on CPUs that do "
        "not, such as AVX2 ones, where bf16 runs several times slower); `auto` picks by the device "
        "(`modelkit.sampler.fast_bf16`); or the live training model (`live`: no extra memory, slower: "
        "unmerged LoRA)",
    )
    share_context_cache: bool = Field(
        True,
        description="run the teacher and the student (gradients included) once "
        "over the token prefix that all prompts of a batch "
        "share (the system prompt and the lessons when they are the same) and reuse its KV cache "
        "(modelkit.prefix_kv, which the transformers backend's prefix cache uses too)",
    )
    min_shared_prefix: int = Field(
        MIN_SHARED_PREFIX,
        ge=1,
        description="shorter shared prefixes are not worth a separate pass "
        "(the same rule and default as the backend's model.options.min_shared_prefix)",
    )
    processes: int = Field(
        1,
        ge=1,
        description="data-parallel training processes, one per device: 1 trains in the calling process; "
        "N > 1 makes `distill.opcd.job.run_job` launch N ranks (gloo on CPU, one per GPU with NCCL on CUDA), "
        "each taking its share of every global batch of `batch_size` prompts, gradients averaged by tokens",
    )
    seed: int = 0
    eval_seed: int = Field(1234, description="sampling seed of evaluate_kl, fixed so evaluations compare")
    divergence_max_loss: float = Field(
        100.0, gt=0, description="a loss above this (nats per token) aborts the run as diverged"
    )
    divergence_spike_factor: float = Field(
        10.0, gt=1, description="a loss above this multiple of the median of recent losses counts as a spike"
    )
    divergence_spike_floor: float = Field(
        1.0,
        gt=0,
        description="the median is floored at this many nats, so that the noise of a nearly converged "
        "run (tiny median) is not mistaken for divergence",
    )
    divergence_patience: int = Field(3, ge=1, description="consecutive spikes that abort the run")
    divergence_window: int = Field(20, ge=2, description="how many recent losses the median is taken over")

    @model_validator(mode="before")
    @classmethod
    def _legacy_renormalize(cls, data):
        """Kept so that stored runs and old configs load: `renormalize: true|false` is `tail: renormalize|drop`."""
        if isinstance(data, dict) and "renormalize" in data:
            data = dict(data)
            legacy = data.pop("renormalize")
            if "tail" in data:
                raise ValueError("give `tail` alone; `renormalize` is its old spelling (true: tail 'renormalize')")
            if not isinstance(legacy, bool):
                raise ValueError(
                    f"renormalize must be true or false, got {legacy!r} (now spelt tail: bucket | renormalize | drop)"
                )
            data["tail"] = "renormalize" if legacy else "drop"
        return data

    @field_validator("objective")
    @classmethod
    def _registered(cls, name: str) -> str:
        get_objective(name)  # an unknown name raises, listing the accepted ones
        return name

    @model_validator(mode="after")
    def _check(self) -> OPCDConfig:
        if self.tail == "renormalize" and not get_objective(self.objective).uses_tail:
            kl = ", ".join(name for name in list_objectives() if get_objective(name).uses_tail)
            raise ValueError(
                f"tail 'renormalize' applies to the KL objectives ({kl}), not to objective={self.objective!r}"
            )
        return self
