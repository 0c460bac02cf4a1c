"""A separate teacher model for OPCD (cross-size distillation): which one, whether it may teach, and loading it.

The paper (arXiv 2602.12275, "cross-size distillation"; LMOps' `--ref_model_path`) lets a larger model with
the context teach a smaller student, e.g. Qwen3-8B with the lessons teaching Qwen3-1.7B without them. The
loss compares the two models' next-token distributions position by position over ONE vocabulary (the
student's top-k token ids looked up in the teacher's distribution), and both models read the same token ids
(the prompts are rendered once, with the student's tokenizer). So a teacher may teach only if its tokenizer
maps every token to the same id as the student's and agrees on the special tokens that end a turn or a
sequence; anything else would silently compare unrelated tokens. `compare_tokenizers` checks exactly that,
by content (the vocabulary and the special tokens), never by object identity: two copies of one tokenizer
loaded from two model directories are the same tokenizer.

Not compared, on purpose: the pad token (only our own padding, masked everywhere, never scored) and the chat
template (the teacher reads the student's rendering; a different template is reported, not refused).

A teacher's output head may have more rows than the tokenizer has tokens (checkpoints pad the embedding
matrix, e.g. to a multiple of 64), and two sizes of one family can pad differently; the trainer then compares
the logits of the rows both heads have (`distill.opcd.policies`), which must cover every token id.

`load_teacher` loads the teacher frozen, with its own LoRA adapter merged in when one is given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from modelkit.config_base import StrictConfig

_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token")
_EXAMPLES = 3


class TeacherTokenizerError(ValueError):
    """The teacher's tokenizer differs from the student's; OPCD cannot compare their distributions."""


class TeacherSpec(StrictConfig):
    """A separate teacher for OPCD: cross-size distillation (the paper's Qwen3-8B with the lessons teaching
    Qwen3-1.7B without them; LMOps' `--ref_model_path`). Without one the teacher is the student's own start-of-cycle
    policy (the parent adapter, or the base model). Its tokenizer must be the student's (same vocabulary and special
    tokens, `check_teacher`): a cycle refuses any other.

    One type from the config to the trainer: a run's config names the model as a person wrote it (`opcd.teacher`:
    an alias, a Hugging Face id or a path), and the cycle hands the trainer's job (`distill.opcd.job.TrainJob`) a
    copy whose `model` is resolved to what `from_pretrained` loads."""

    model: str = Field(
        ...,
        description="alias, Hugging Face id (already in the local cache: nothing is downloaded), or local path; "
        "in a training job, the resolved checkpoint",
    )
    adapter: str | None = Field(None, description="a LoRA adapter directory applied to the teacher (merged at load)")
    device: str | None = Field(
        None,
        pattern=r"^(cpu|cuda(:\d+)?)$",
        description="cpu, cuda or cuda:N; default: the student's device (under data parallel, each rank's own)",
    )


@dataclass
class VocabularyCheck:
    """What `compare_tokenizers` found: `same` decides; the rest says how the two differ."""

    same: bool
    student_tokens: int
    teacher_tokens: int
    differences: list[str] = field(default_factory=list)
    chat_template_same: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        if self.same:
            template = "" if self.chat_template_same else "; its chat template differs (the student's is used)"
            return f"same vocabulary and special tokens as the student ({self.student_tokens} tokens){template}"
        return "DIFFERENT from the student's: " + "; ".join(self.differences)


def _shown(items: list) -> str:
    return ", ".join(repr(x) for x in items[:_EXAMPLES]) + (", ..." if len(items) > _EXAMPLES else "")


def _added_specials(tokenizer) -> dict[int, str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {
        i: str(t.content if hasattr(t, "content") else t) for i, t in decoder.items() if getattr(t, "special", True)
    }


def compare_tokenizers(student, teacher) -> VocabularyCheck:
    """Whether `teacher` (a transformers tokenizer) tokenises exactly as `student` does: the same token -> id
    map, the same BOS/EOS/UNK tokens, the same special added tokens at the same ids."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    differences = []
    only_student = sorted(set(s_vocab) - set(t_vocab))
    only_teacher = sorted(set(t_vocab) - set(s_vocab))
    moved = sorted(tok for tok in set(s_vocab) & set(t_vocab) if s_vocab[tok] != t_vocab[tok])
    if only_student or only_teacher or moved:
        parts = [f"vocabulary: {len(s_vocab)} tokens vs the teacher's {len(t_vocab)}"]
        if only_student:
            parts.append(f"{len(only_student)} only in the student's ({_shown(only_student)})")
        if only_teacher:
            parts.append(f"{len(only_teacher)} only in the teacher's ({_shown(only_teacher)})")
        if moved:
            parts.append(
                f"{len(moved)} at different ids ("
                + ", ".join(f"{tok!r}: {s_vocab[tok]} vs {t_vocab[tok]}" for tok in moved[:_EXAMPLES])
                + (", ..." if len(moved) > _EXAMPLES else "")
                + ")"
            )
        differences.append(", ".join(parts))
    for name in _NAMED_SPECIALS:
        mine, theirs = getattr(student, name, None), getattr(teacher, name, None)
        if str(mine) != str(theirs):
            differences.append(f"{name}: {mine!r} vs the teacher's {theirs!r}")
    s_special, t_special = _added_specials(student), _added_specials(teacher)
    if s_special != t_special:
        changed = sorted({i for i in set(s_special) | set(t_special) if s_special.get(i) != t_special.get(i)})
        differences.append(
            "special tokens: "
            + ", ".join(f"id {i}: {s_special.get(i)!r} vs {t_special.get(i)!r}" for i in changed[:_EXAMPLES])
            + (", ..." if len(changed) > _EXAMPLES else "")
        )
    template_same = getattr(student, "chat_template", None) == getattr(teacher, "chat_template", None)
    return VocabularyCheck(not differences, len(s_vocab), len(t_vocab), differences, template_same)


def load_tokenizer(model_path: str, *, pad: bool = False):
    """The tokenizer of a local checkpoint (or a cached Hugging Face id), offline; no weights are read. `pad`: it
    pads with EOS if it has no pad token (what batched training and scoring need)."""
    from transformers import AutoTokenizer

    if Path(model_path).is_absolute() and not Path(model_path).is_dir():
        raise FileNotFoundError(
            f"model directory {model_path} does not exist; give a local checkpoint directory "
            "(or a Hugging Face id already in the cache)"
        )
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    if pad and tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def require_same_tokenizer(student, teacher, teacher_name: str) -> VocabularyCheck:
    """`compare_tokenizers`, raising `TeacherTokenizerError` (saying what differs) when they differ."""
    check = compare_tokenizers(student, teacher)
    if not check.same:
        raise TeacherTokenizerError(
            f"the teacher {teacher_name} does not share the student's tokenizer: {'; '.join(check.differences)}. "
            "OPCD compares the two models' next-token distributions over one vocabulary, so the teacher must "
            "tokenise exactly as the student does (same vocabulary and special tokens): a model of the same "
            "family, e.g. Qwen3-8B teaching Qwen3-1.7B"
        )
    return check


def check_teacher(student_path: str, spec: TeacherSpec) -> VocabularyCheck:
    """Load both tokenizers (no weights) and require that they are the same (`require_same_tokenizer`)."""
    return require_same_tokenizer(load_tokenizer(student_path), load_tokenizer(spec.model), spec.model)


def load_teacher(spec: TeacherSpec, device):
    """The teacher as a frozen plain causal LM on `device`, its adapter (if any) merged in."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec.model, local_files_only=True)
    if spec.adapter:
        from distill.opcd.adapters import load_adapter

        model = load_adapter(model, spec.adapter).merge_and_unload()
    return model.to(device).eval().requires_grad_(False)
