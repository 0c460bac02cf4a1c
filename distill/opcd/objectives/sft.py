"""`sft`, the supervised baseline: the teacher samples with the context, and the student learns the samples by
cross-entropy. On the token path that is -log p_s of each response token at temperature 1 whatever the
config's (plain SFT on the samples, which were drawn at the config's temperature); on the choice path one
action per prompt is drawn from the teacher's choice policy and the loss is -log pi_s of it, both at the
config's temperature (the tempered policy is the one the agent acts with). Neither reads the teacher's logits
nor a top-k, so the teacher's head is not run on the responses and `tail` means nothing."""

from __future__ import annotations

import torch

from distill.opcd.losses import token_log_probs
from distill.opcd.objectives.registry import Objective
from modelkit.choice import choice_distribution


def token_loss(student_logits, teacher_logits, targets, *, k, temperature, tail):
    if targets is None:
        raise ValueError("objective 'sft' needs the sampled token ids (targets)")
    return -token_log_probs(student_logits, targets, 1.0).squeeze(-1), None


def choice_loss(student, teacher, *, temperature, generator):
    picks = [
        int(torch.multinomial((t.float().cpu() / temperature).softmax(-1), 1, generator=generator)) for t in teacher
    ]
    return torch.stack([-choice_distribution(s, temperature)[pick] for s, pick in zip(student, picks)]).mean()


SFT = Objective(
    name="sft",
    description="teacher samples with the context, cross-entropy on them",
    samples="teacher",
    token_loss=token_loss,
    choice_loss=choice_loss,
    reads_teacher_logits=False,
    uses_tail=False,
)
