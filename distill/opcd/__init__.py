"""On-policy context distillation (OPCD): losses, trainer, baselines, adapter I/O.

`topk_reverse_kl` is the paper's objective; `OPCDTrainer` runs it with a LoRA student and a teacher that is
the same model with the start-of-cycle adapter (or none); `OffPolicyDistillTrainer` and `TeacherSFTTrainer`
are the baselines. See `distill/opcd/trainer.py` for the loop and the speed choices.
"""

from distill.opcd.losses import chunked_topk_divergence, topk_forward_kl, topk_reverse_kl

__all__ = ["chunked_topk_divergence", "topk_forward_kl", "topk_reverse_kl"]
