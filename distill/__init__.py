"""Distillation of experience into weights.

`distill.opcd` consolidates lessons held in context into LoRA adapters by on-policy context distillation
(OPCD: the student without the lessons learns to match the teacher with them on its own samples), with the
paper's baselines (off-policy context distillation, SFT on teacher samples). Lessons themselves (extraction,
curation, budgets) live beside it. Dependency arrows: `agent_runtime -> distill -> memory`; nothing here
imports `agent_runtime`.
"""
