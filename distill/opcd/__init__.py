"""On-policy context distillation (OPCD): losses, trainer, baselines, adapter I/O.

`topk_reverse_kl` is the paper's objective; `OPCDTrainer` runs it with a LoRA student and, as teacher, the
same model with the start-of-cycle adapter (or none) plus the context in its system message, or a separate
model sharing the tokenizer (`TeacherSpec`: cross-size distillation, `distill.opcd.teacher`). The baselines
(off-policy context distillation, SFT on teacher samples) are the same trainer with `OPCDConfig.objective`
set to `off_policy` or `sft`, names in the registry of objectives (`distill.opcd.objectives`). System-prompt distillation is OPCD with one fixed context string. `run_job`
runs one training job (KL before, training, KL after, adapter) in this process or data parallel.
"""

from distill.opcd.adapters import (
    AdapterExistsError,
    atomic_directory,
    load_adapter,
    read_metadata,
    remove_partial_writes,
)
from distill.opcd.config import OPCDConfig
from distill.opcd.job import JobError, JobResult, TrainJob, run_job
from distill.opcd.losses import chunked_topk_divergence, topk_forward_kl, topk_reverse_kl
from distill.opcd.teacher import TeacherSpec, TeacherTokenizerError, VocabularyCheck, compare_tokenizers
from distill.opcd.trainer import DivergenceError, OPCDTrainer, with_context

__all__ = [
    "AdapterExistsError",
    "DivergenceError",
    "JobError",
    "JobResult",
    "OPCDConfig",
    "OPCDTrainer",
    "TeacherSpec",
    "TeacherTokenizerError",
    "TrainJob",
    "VocabularyCheck",
    "atomic_directory",
    "chunked_topk_divergence",
    "compare_tokenizers",
    "load_adapter",
    "read_metadata",
    "remove_partial_writes",
    "run_job",
    "topk_forward_kl",
    "topk_reverse_kl",
    "with_context",
]
