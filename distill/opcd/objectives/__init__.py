"""The distillation objectives (`OPCDConfig.objective`): a registry of declarations, one module per objective.

`registry` holds `Objective` and `register`/`get_objective`/`list_objectives`. Each built-in's module declares
it and importing this package registers them, the paper's method and its two baselines: `opcd` (the student
samples, reverse KL), `off_policy` (the teacher samples with the context, forward KL) and `sft` (the same
samples, cross-entropy).
"""

from distill.opcd.objectives.off_policy import OFF_POLICY
from distill.opcd.objectives.opcd import OPCD
from distill.opcd.objectives.registry import (
    ChoiceLoss,
    DuplicateObjectiveError,
    Objective,
    TokenLoss,
    UnknownObjectiveError,
    get_objective,
    list_objectives,
    register,
    unregister,
)
from distill.opcd.objectives.sft import SFT

for _builtin in (OPCD, OFF_POLICY, SFT):  # in this order: the method first, in listings and error messages
    register(_builtin)

__all__ = [
    "OFF_POLICY",
    "OPCD",
    "SFT",
    "ChoiceLoss",
    "DuplicateObjectiveError",
    "Objective",
    "TokenLoss",
    "UnknownObjectiveError",
    "get_objective",
    "list_objectives",
    "register",
    "unregister",
]
