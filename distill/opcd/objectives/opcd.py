"""`opcd`, the method (arXiv 2602.12275): the student samples without the context, and learns the reverse KL
to the teacher with it: on the student's top-k per response token (`distill.opcd.losses.topk_divergence`), and
exactly over the action set on the choice path."""

from __future__ import annotations

from distill.opcd.losses import topk_divergence
from distill.opcd.objectives.registry import Objective
from modelkit.choice import choice_divergence


def token_loss(student_logits, teacher_logits, targets, *, k, temperature, tail):
    return topk_divergence(
        student_logits, teacher_logits, divergence="reverse", k=k, temperature=temperature, tail=tail, targets=targets
    )


def choice_loss(student, teacher, *, temperature, generator):
    return choice_divergence(student, teacher, divergence="reverse", temperature=temperature)


OPCD = Objective(
    name="opcd",
    description="student samples, reverse KL on the student's top-k (the method)",
    samples="student",
    token_loss=token_loss,
    choice_loss=choice_loss,
)
