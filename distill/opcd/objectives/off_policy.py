"""`off_policy`, the off-policy context-distillation baseline: the teacher samples with the context, and the
student learns the forward KL from it: on the teacher's top-k per response token, exactly over the action set
on the choice path."""

from __future__ import annotations

from distill.opcd.losses import topk_divergence
from distill.opcd.objectives.registry import Objective
from modelkit.choice import choice_divergence


def token_loss(student_logits, teacher_logits, targets, *, k, temperature, tail):
    return topk_divergence(
        student_logits, teacher_logits, divergence="forward", k=k, temperature=temperature, tail=tail, targets=targets
    )


def choice_loss(student, teacher, *, temperature, generator):
    return choice_divergence(student, teacher, divergence="forward", temperature=temperature)


OFF_POLICY = Objective(
    name="off_policy",
    description="teacher samples with the context, forward KL on the teacher's top-k",
    samples="teacher",
    token_loss=token_loss,
    choice_loss=choice_loss,
)
