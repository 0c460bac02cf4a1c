"""The distillation objectives by name: what each one samples, what it reads, and the loss it minimises.

An objective is a declaration (`Objective`), not a branch of the trainer: who samples the free-text responses
(the student without the context: on-policy; the teacher with it: off-policy), whether its token loss reads the
teacher's logits and the top-k's tail (`OPCDConfig.tail`), and its two losses, one per way a step is given its
prompts: the token path, a loss per response position that `distill.opcd.losses.chunked_token_loss` computes
chunk by chunk, and the choice path, a loss over each prompt's action set (`modelkit.choice`).
`OPCDConfig.objective` names one and is checked against this registry; `OPCDTrainer.step` looks it up and calls
it. Adding an objective is one module that builds an `Objective` and `register`s it (the built-ins: this
package's `opcd`, `off_policy` and `sft`), and its test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

TokenLoss = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
"""(student logits (B, C, V), teacher logits (B, C, V) or None when not read, response token ids (B, C, 1) or
None, *, k, temperature, tail) -> (loss per position (B, C), log p_s - log p_t at the response tokens without
gradient, or None): one chunk of response positions."""
ChoiceLoss = Callable[..., torch.Tensor]
"""(student, teacher: one tensor of action log-probabilities per prompt, *, temperature, generator) -> the mean
loss over the prompts; `generator` is the step's seeded source for whatever the loss draws."""


class UnknownObjectiveError(ValueError):
    """No objective is registered under the name."""


class DuplicateObjectiveError(ValueError):
    """The name is taken."""


@dataclass(frozen=True)
class Objective:
    """One distillation objective (module docstring). Its samples and losses follow from these fields alone."""

    name: str
    description: str
    samples: Literal["student", "teacher"]  # who writes the token path's responses (the teacher: with the context)
    token_loss: TokenLoss
    choice_loss: ChoiceLoss
    reads_teacher_logits: bool = True  # False: the teacher's head is not run on the responses' chunks
    uses_tail: bool = True  # False: the loss never looks past the sampled token, so a tail treatment means nothing

    @property
    def on_policy(self) -> bool:
        """The student samples: the mean sampled-token log-ratio then estimates the full reverse KL."""
        return self.samples == "student"


_objectives: dict[str, Objective] = {}


def register(objective: Objective) -> Objective:
    """Make `objective` selectable by its name (`OPCDConfig.objective`); returns it. Raises
    DuplicateObjectiveError if the name is taken."""
    if objective.name in _objectives:
        raise DuplicateObjectiveError(f"objective {objective.name!r} is already registered; pick another name")
    _objectives[objective.name] = objective
    return objective


def unregister(name: str) -> None:
    """Remove the objective registered as `name` (a test's, a plugin's)."""
    get_objective(name)
    del _objectives[name]


def get_objective(name: str) -> Objective:
    """The objective registered as `name`; UnknownObjectiveError (a ValueError) names the accepted ones."""
    if name not in _objectives:
        raise UnknownObjectiveError(f"unknown objective {name!r}; accepted: {', '.join(list_objectives())}")
    return _objectives[name]


def list_objectives() -> list[str]:
    """The registered objectives' names, built-ins first (in registration order)."""
    return list(_objectives)
