"""The two KL objectives differ only in who samples and the direction of the divergence: one declaration for both.
On the token path the KL is taken on the sampler's top-k per response token (`distill.opcd.losses.topk_divergence`),
on the choice path exactly over the action set (`modelkit.choice.choice_divergence`)."""

from __future__ import annotations

from functools import partial
from typing import Literal

from distill.opcd.losses import topk_divergence
from distill.opcd.objectives.registry import Objective
from modelkit.choice import choice_divergence


def _token_loss(student_logits, teacher_logits, targets, *, k, temperature, tail, divergence):
    return topk_divergence(
        student_logits, teacher_logits, divergence=divergence, k=k, temperature=temperature, tail=tail, targets=targets
    )


def _choice_loss(student, teacher, *, temperature, generator, divergence):
    return choice_divergence(student, teacher, divergence=divergence, temperature=temperature)


def kl_objective(name: str, description: str, samples: Literal["student", "teacher"], divergence: str) -> Objective:
    """A KL objective: `samples` ("student" or "teacher") draws the responses, `divergence` ("reverse" or
    "forward") is the KL the student learns."""
    return Objective(
        name=name,
        description=description,
        samples=samples,
        token_loss=partial(_token_loss, divergence=divergence),
        choice_loss=partial(_choice_loss, divergence=divergence),
    )
