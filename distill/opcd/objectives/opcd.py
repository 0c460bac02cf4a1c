"""`opcd`, the method (arXiv 2602.12275): the student samples without the context, and learns the reverse KL
to the teacher with it: on the student's top-k per response token, and exactly over the action set on the choice
path."""

from __future__ import annotations

from distill.opcd.objectives.kl import kl_objective

OPCD = kl_objective(
    "opcd", "student samples, reverse KL on the student's top-k (the method)", samples="student", divergence="reverse"
)
