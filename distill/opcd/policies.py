"""The student and the teacher of an OPCD run: who they are (which weights) and what they see (which prompt).

The student is the current policy plus a trainable LoRA adapter (or, for `full_finetune`, the model's own
weights). The teacher is the frozen start-of-cycle policy, and it costs no second copy of the weights when it
can be a view of the same model:
- no parent adapter: the same model with the adapter disabled (the base policy);
- a parent adapter (the promoted adapter of the last cycle): the same model with that adapter switched in,
  frozen, while the student starts as a copy of it;
or, with a copy: an explicit `teacher_model` (a larger model sharing the tokenizer: cross-size distillation,
`distill.opcd.teacher`), or, for `full_finetune`, a frozen copy of the model taken before the first step.

A separate teacher may sit on another device than the student, and its output head may have a different
number of rows (checkpoints pad the embedding matrix, and two sizes of one family can pad differently):
`fit_head` makes each head's logits comparable, cut to the rows both heads have and on the student's device.
With the teacher a view of the student's own model nothing is cut or moved.

The teacher sees the same prompt as the student with the context (lessons, a system prompt) appended to the
system message (`with_context`); both are tokenised by `modelkit.chat_tokens`, so the lessons are text.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence

import torch

from distill.opcd.config import OPCDConfig
from modelkit.chat_tokens import Chat
from modelkit.sampler import MergedSampler, sampler_dtype


class PromptContexts:
    """Each prompt's own lesson pools (one drawn per sample, as with shared pools): the lessons in scope for the
    environment the prompt came from (`distill.lessons.scope`). Prompts are told apart by identity: give the
    same chat objects to `train`."""

    def __init__(self, prompts: Sequence[Chat], pools: Sequence[Sequence[str]]):
        if len(prompts) != len(pools):
            raise ValueError(f"{len(prompts)} prompts but {len(pools)} context lists; give one per prompt")
        if any(not p for p in pools):
            raise ValueError("every prompt needs at least one context (an empty string: none)")
        self._pools = {id(chat): list(p) for chat, p in zip(prompts, pools)}

    def pools(self, chat: Chat) -> list[str]:
        found = self._pools.get(id(chat))
        assert found is not None, "a prompt without its contexts: give `train` the chats PromptContexts was built on"
        return found


def with_context(chat: Chat, context: str) -> Chat:
    """The teacher's view of a prompt: `context` appended to the system message (added when there is none)."""
    if not context:
        return list(chat)
    if chat and chat[0].get("role") == "system":
        return [{**chat[0], "content": f"{chat[0]['content']}\n\n{context}"}, *chat[1:]]
    return [{"role": "system", "content": context}, *chat]


class _FittedHead:
    """An output head whose logits are cut to the first `rows` and moved to `device`."""

    def __init__(self, head, rows: int | None, device: torch.device):
        self.head, self.rows, self.device = head, rows, device
        self.weight = head.weight

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        if self.rows is not None:
            logits = logits[..., : self.rows]
        return logits.to(self.device)


class Policies:
    """From one base model: the student (`model`, trained; `sampling_model()` to sample from it) and the teacher
    (`teacher()`, switched in for a block)."""

    def __init__(self, model, config: OPCDConfig, *, teacher_model=None, parent_adapter: str | None = None):
        from peft import PeftModel

        if isinstance(model, PeftModel):
            raise TypeError("pass the base model; the current adapter goes in parent_adapter=<its directory>")
        if config.full_finetune and parent_adapter is not None:
            raise ValueError("full_finetune trains the model's own weights; merge the parent adapter first")
        self.config = config
        self.parent_adapter = parent_adapter
        self.teacher_model = teacher_model
        self.sampler = None  # copied before an adapter is attached: it holds the plain modules
        if config.sampler != "live":
            self.sampler = MergedSampler(model, sampler_dtype(config.sampler, model.device))
        if config.full_finetune:
            self.model = model
            if teacher_model is None:
                self.teacher_model = copy.deepcopy(model).eval().requires_grad_(False)
        else:
            self.model = self._attach_lora(model)
        self.rows: int | None = None  # the logit rows compared, when the two heads differ in size
        if self.teacher_model is not None:
            self.teacher_model.eval().requires_grad_(False)
            student_rows = self.student_lm.get_output_embeddings().weight.shape[0]
            teacher_rows = self.teacher_model.get_output_embeddings().weight.shape[0]
            if student_rows != teacher_rows:
                self.rows = min(student_rows, teacher_rows)
        if config.gradient_checkpointing:
            enable_checkpointing(self.student_lm)

    def _attach_lora(self, model):
        from peft import LoraConfig, PeftModel, get_peft_model
        from peft.tuners.tuners_utils import BaseTunerLayer

        model.requires_grad_(False)
        if self.parent_adapter:
            peft_model = PeftModel.from_pretrained(
                model, self.parent_adapter, adapter_name="default", is_trainable=True
            )
            if self.teacher_model is None:
                peft_model.load_adapter(self.parent_adapter, adapter_name="parent", is_trainable=False)
            peft_model.set_adapter("default")
            return peft_model
        cfg = self.config
        lora = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=cfg.lora_target_modules,
            bias="none",
            task_type="CAUSAL_LM",
        )
        peft_model = get_peft_model(model, lora)
        if isinstance(peft_model.get_base_model().get_output_embeddings(), BaseTunerLayer):
            raise ValueError(  # noqa: TRY004 - a bad config value, not a bad argument type
                "lora_target_modules must not include the output head: the teacher's logits are computed with "
                "the head outside the adapter switch"
            )
        return peft_model

    @property
    def student_lm(self):
        """The student as a plain causal LM (the LoRA layers sit inside it)."""
        return self.model if self.config.full_finetune else self.model.get_base_model()

    def fit_head(self, head):
        """`head` as the loss uses it: logits cut to `rows` when the heads differ in size, on the student's
        device; the head itself when neither applies (the teacher a view of the student's model)."""
        device = self.student_lm.get_output_embeddings().weight.device
        if self.rows is None and head.weight.device == device:
            return head
        return _FittedHead(head, self.rows, device)

    @contextlib.contextmanager
    def sampling_model(self) -> Iterator[torch.nn.Module]:
        """What the student samples from: the live model, or the merged copy (`modelkit.sampler`)."""
        if self.sampler is None:
            yield self.model
        else:
            with self.sampler.weights_of(self.student_lm) as merged:
                yield merged

    @contextlib.contextmanager
    def teacher(self) -> Iterator[torch.nn.Module]:
        """The teacher as a plain causal LM, switched in for the duration of the block (no gradients)."""
        with torch.no_grad():
            if self.teacher_model is not None:
                yield self.teacher_model
            elif self.parent_adapter:
                self.model.set_adapter("parent", inference_mode=True)
                try:
                    yield self.student_lm
                finally:
                    self.model.set_adapter("default")
            else:
                with self.model.disable_adapter():
                    yield self.student_lm


def enable_checkpointing(lm) -> None:
    """Gradient (activation) checkpointing on a causal LM's layers, non-reentrant (what a LoRA student and a
    shared-prefix cache need), under the name this transformers gives it."""
    if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5.2 renamed it
        lm.activation_checkpointing_enable({"use_reentrant": False})
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
