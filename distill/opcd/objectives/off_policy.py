"""`off_policy`, the off-policy context-distillation baseline: the teacher samples with the context, and the
student learns the forward KL from it: on the teacher's top-k per response token, exactly over the action set
on the choice path."""

from __future__ import annotations

from distill.opcd.objectives.kl import kl_objective

OFF_POLICY = kl_objective(
    "off_policy",
    "teacher samples with the context, forward KL on the teacher's top-k",
    samples="teacher",
    divergence="forward",
)
