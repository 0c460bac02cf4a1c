"""`OPCDTrainer`: on-policy context distillation of a context (lessons, a system prompt) into weights.

One step (the method: docs/architecture.md): the student (the current policy plus a trainable LoRA adapter)
samples one response per prompt WITHOUT the context, at the config's temperature, up to and including the
first EOS; the teacher (the frozen start-of-cycle policy) scores the same response tokens with the context
appended to the system message of the same prompt; the loss is `topk_reverse_kl` on the student's top-k,
token-mean over the batch; one AdamW step at a constant learning rate with the gradient clipped to 1.0.

This module is the loop: steps, the train loop over prompt and context sources, the divergence guard,
evaluation and saving. Its parts live beside it, one job each:
- `distill.opcd.batches`: what each step is given (prompts, each one's context, anchors, the learning rate);
- `distill.opcd.policies`: the student and the teacher from one base model (LoRA attached, the teacher as the
  adapter disabled, a parent adapter switched in, or a frozen copy), and `with_context`, the teacher's prompt;
- `modelkit.sampler`: the student samples from a merged copy of its weights (bf16 where the device has it),
  released right after sampling, so it never adds to the training half's memory peak;
- `distill.opcd.scoring`: hidden states at the response positions; the frozen teacher runs the token prefix its
  prompts share (system prompt, lessons) once per cycle (`modelkit.prefix_kv.FrozenPrefixes`);
- `distill.opcd.losses`: the divergences from hidden states in sequence chunks (the two models' (B, T, V) logits
  never held at once); `modelkit.choice`: the choice policy; `modelkit.chat_tokens`: prompts to token ids.

Choice mode (the agent acts by choosing among admissible actions): a step given one action set per prompt
distils the policy the agent acts with, the distribution over the set, instead of free text: the student's
and the teacher's sequence log-probabilities of every action come from one packed forward each
(`modelkit.choice`) and the divergence is exact over the set, so nothing is sampled (but what a loss draws).

Baselines share the loop (`config.objective`): the step looks the objective up by name
(`distill.opcd.objectives`), samples from the policy it names and calls its token or choice loss; `off_policy`
(the teacher samples with the context, forward KL), `sft` (cross-entropy on its samples). System-prompt
distillation is OPCD with a fixed context.

Data parallel (`OPCDConfig.processes`, `distill.opcd.job`): in a `torch.distributed` group every method below is a
collective all ranks call in one order; `batch_size` is the global prompts per step, each rank takes its share, the
loss and gradient are combined by tokens (`distill.opcd.collectives`); rank 0 alone calls `on_step` and saves.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from distill.opcd.adapters import atomic_directory, write_metadata
from distill.opcd.batches import (
    ContextSource,
    anchors_in_step,
    context_picker,
    lr_factor,
    prompt_stream,
    split_validation,
    with_anchors,
)
from distill.opcd.collectives import average_gradients, global_loss, world
from distill.opcd.config import OPCDConfig
from distill.opcd.losses import ChunkedLoss, chunked_token_loss, chunked_topk_divergence
from distill.opcd.objectives import Objective, get_objective
from distill.opcd.policies import Policies, PromptContexts, with_context
from distill.opcd.scoring import pad_responses, response_hidden
from modelkit.chat_tokens import Chat, encode_chat
from modelkit.choice import action_token_ids, choice_divergence, choice_logprobs, lm_parts, pack_choices
from modelkit.prefix_kv import (
    FrozenPrefixes,
    checkpoint_keeps_read_only_cache,
    plain_kv_layers,
    read_only_prefix,
    reading_cache_under_checkpointing,
    shared_prefix_length,
)
from modelkit.sampler import sample_responses

__all__ = ["DivergenceError", "OPCDTrainer", "PromptContexts", "with_context"]


class DivergenceError(RuntimeError):
    """The loss became NaN/inf or diverged; the run must be aborted and its adapter rolled back."""


class OPCDTrainer:
    """Distils `contexts` into `model` (see the module docstring). `model` is a plain transformers causal LM."""

    def __init__(
        self, model, tokenizer, config: OPCDConfig, *, teacher_model=None, parent_adapter: str | Path | None = None
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.parent_adapter = str(parent_adapter) if parent_adapter else None
        self.steps_done = 0
        # tokens through the student with gradients, the frozen teacher, and the student without them (the held-out
        # KL), padding left out; each step's share goes into its metrics (train_/teacher_/scored_tokens)
        self.tokens = {"train": 0, "teacher": 0, "scored": 0}
        self.history: list[dict] = []
        self._spikes = 0
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = model.generation_config.eos_token_id
        self._eos_ids = sorted({tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None})
        self.policies = Policies(model, config, teacher_model=teacher_model, parent_adapter=self.parent_adapter)
        self.model = self.policies.model
        rows = self.policies.rows
        if rows is not None and rows < len(tokenizer):
            raise ValueError(
                f"the teacher's and the student's output heads share only {rows} rows, fewer than the "
                f"tokenizer's {len(tokenizer)} tokens; the teacher must cover the whole vocabulary"
            )
        # the teacher's shared prefix is spliced into its batch cache: only for models whose cache allows it
        self._share_teacher_prefix = (
            config.share_context_cache and plain_kv_layers(self.policies.teacher_model or self.policies.student_lm) > 0
        )
        # a checkpointed student runs its rows whole where transformers would drop the prefix's cache under it
        self._share_student_prefix = (
            config.share_context_cache
            and plain_kv_layers(self.policies.student_lm) > 0
            and (not config.gradient_checkpointing or checkpoint_keeps_read_only_cache())
        )
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        assert self._params, "nothing to train"
        self.optimizer = torch.optim.AdamW(self._params, lr=config.lr, weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: lr_factor(self.config, step))
        self._teacher_choices: dict[tuple, torch.Tensor] = {}  # the frozen teacher's choice scores, per prompt
        self._teacher_prefixes = FrozenPrefixes()  # and the KV of the prefixes its free-text rows share
        self.validation: list[dict] = []  # {"step", "val_kl"} per validation measurement
        self.best: dict | None = None  # the best of them; its adapter is the one kept
        self.stopped_early = False
        self._best_state: list[torch.Tensor] | None = None
        self.rank, self.world_size = world()
        if self.world_size > 1:  # every rank starts from rank 0's adapter, whatever its own seed drew
            with torch.no_grad():
                for param in self._params:
                    torch.distributed.broadcast(param.data, src=0)

    @property
    def _student_lm(self):
        return self.policies.student_lm

    # -- prompts and sampling ----------------------------------------------------------------------------
    def render(self, chat: Chat) -> list[int]:
        """Token ids of a chat prompt, ready for the assistant's turn (cut to max_prompt_tokens from the left);
        content (observations, replies, the teacher's lessons) is tokenised as text (`modelkit.chat_tokens`)."""
        ids = encode_chat(self.tokenizer, chat).ids
        return ids[-self.config.max_prompt_tokens :] if self.config.max_prompt_tokens else ids

    def _generate(self, causal_lm, prompts: list[list[int]]) -> list[list[int]]:
        cfg = self.config
        return sample_responses(
            causal_lm,
            prompts,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            eos_ids=self._eos_ids,
            pad_id=self._pad_id,
        )

    def _sample_student(self, prompts: list[list[int]]) -> list[list[int]]:
        with self.policies.sampling_model() as sampler:
            return self._generate(sampler, prompts)

    def _sample_teacher(self, prompts: list[list[int]]) -> list[list[int]]:
        with self.policies.teacher() as teacher:
            return self._generate(teacher, prompts)

    def _shared_prefix(self, prompts: list[list[int]], share: bool | None = None) -> int:
        """Tokens all `prompts` share, when worth running once and `share` (default: the teacher's) allows; else 0."""
        share = self._share_teacher_prefix if share is None else share
        return shared_prefix_length(prompts, self.config.min_shared_prefix) if share else 0

    def _teacher_hidden(self, prompts: list[list[int]], responses: list[list[int]]) -> tuple[torch.Tensor, object]:
        self.model.eval()
        with self.policies.teacher() as teacher:
            shared, prefixes = self._shared_prefix(prompts), self._teacher_prefixes
            hidden = response_hidden(
                teacher, prompts, responses, pad_id=self._pad_id, shared_prefix=shared, prefixes=prefixes
            )
            return hidden, self.policies.fit_head(lm_parts(teacher)[1])

    # -- training ----------------------------------------------------------------------------------------
    def step(self, prompts: list[Chat], contexts: list[str], choices: list[list[str]] | None = None) -> dict:
        """One optimizer step on a batch: sample, score, loss, AdamW. Returns the step's metrics.

        With `choices` (one action set per prompt: the agent acts by choosing), the step distils the choice
        policy instead: the divergence between the student's and the teacher's distributions over each set,
        computed exactly (`modelkit.choice`); nothing is sampled except the SFT baseline's teacher draws."""
        if len(prompts) != len(contexts):
            raise ValueError(f"{len(prompts)} prompts but {len(contexts)} contexts; give one context per prompt")
        if choices is not None and len(choices) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(choices)} action sets; give one set per prompt")
        if not prompts:
            raise ValueError("an empty batch; a step needs at least one prompt")
        cfg = self.config
        started = time.perf_counter()
        batch_size = len(prompts)
        share = self._share(batch_size)
        prompts, contexts = prompts[share], contexts[share]
        choices = choices[share] if choices is not None else None
        result, sampled, scored = None, started, started
        counted = dict(self.tokens)
        objective = get_objective(cfg.objective)
        if prompts and choices is not None:
            result = self._choice_loss(prompts, contexts, choices, objective)
            sampled = scored = time.perf_counter()
        elif prompts:  # a rank gets no prompts only when the global batch is smaller than the number of ranks
            student_ids = [self.render(p) for p in prompts]
            teacher_ids = [self.render(with_context(p, c)) for p, c in zip(prompts, contexts)]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed * 1_000_003 + self.steps_done + (self.rank << 40))
                if objective.on_policy:
                    responses = self._sample_student(student_ids)
                else:
                    responses = self._sample_teacher(teacher_ids)
            sampled = time.perf_counter()
            targets, mask = pad_responses(responses, self._pad_id, self.model.device)
            teacher_hidden, teacher_head = self._teacher_hidden(teacher_ids, responses)
            scored = time.perf_counter()
            self.tokens["teacher"] += sum(len(t) + len(r) for t, r in zip(teacher_ids, responses))
            common = self._shared_prefix(student_ids, self._share_student_prefix)
            self.tokens["train"] += sum(map(len, student_ids + responses)) - common * (len(prompts) - 1)
            self.model.train()
            student_lm = self._student_lm
            hidden = response_hidden(student_lm, student_ids, responses, pad_id=self._pad_id, shared_prefix=common)
            result = chunked_token_loss(
                hidden,
                teacher_hidden,
                mask,
                student_head=self.policies.fit_head(lm_parts(student_lm)[1]),
                teacher_head=teacher_head if objective.reads_teacher_logits else None,
                loss=functools.partial(objective.token_loss, k=cfg.k, temperature=cfg.temperature, tail=cfg.tail),
                targets=targets,
                chunk_size=cfg.chunk_size,
            )
            del hidden, teacher_hidden
        if self.world_size > 1:
            loss, sampled_kl, tokens = global_loss(result, self.model.device)
        else:
            loss, sampled_kl, tokens = result.loss, result.sampled_kl, result.tokens
        self._guard(loss)
        if self.world_size > 1:
            average_gradients(self._params, result.tokens if result else 0, tokens)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, cfg.grad_clip))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise DivergenceError(f"step {self.steps_done}: gradient norm is {grad_norm}; aborting the run")
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.steps_done += 1
        finished = time.perf_counter()
        metrics = {
            "step": self.steps_done,
            "objective": cfg.objective,
            "loss": loss,
            "lr": lr,
            "kl_estimate": sampled_kl if objective.on_policy else float("nan"),
            "tokens": tokens,
            "grad_norm": grad_norm,
            "seconds": finished - started,
            "sample_seconds": sampled - started,
            "teacher_seconds": scored - sampled,
            "train_seconds": finished - scored,
            "response_length": tokens / batch_size,
            **{f"{name}_tokens": n - counted[name] for name, n in self.tokens.items()},
        }
        self.history.append(metrics)
        return metrics

    def _choice_scores(self, prompts: list[Chat], contexts: list[str], choices: list[list[str]]):
        """(student, teacher) sequence log-probabilities of every action; the student's carry gradients when
        they are enabled. Action tokens are the same in both views: they follow the assistant turn's header.
        The teacher is frozen for the trainer's life, so each prompt's teacher scores are computed once and
        kept (a cycle revisits its prompts every pass)."""
        student_ids = [self.render(p) for p in prompts]
        teacher_ids = [self.render(with_context(p, c)) for p, c in zip(prompts, contexts)]
        actions = []
        for chat, options in zip(prompts, choices):
            ids = encode_chat(self.tokenizer, chat).ids
            actions.append(action_token_ids(self.tokenizer, chat, ids, options, self.tokenizer.eos_token_id))
        teacher_logp = self._teacher_choice_scores(teacher_ids, actions)
        self.model.train(torch.is_grad_enabled())
        student_logp, fed = self._scored(self._student_lm, student_ids, actions, share=self._share_student_prefix)
        self.tokens["train" if torch.is_grad_enabled() else "scored"] += fed
        return student_logp, teacher_logp

    def _scored(self, causal_lm, ids: list[list[int]], actions: list[list[list[int]]], *, share: bool):
        """(`choice_logprobs` of the rows, the tokens that went through the model). With `share`, the prefix all
        rows have in common (the system prompt, and the lessons in the teacher's view) runs once as a batch-1
        sequence and its KV serves every row; gradients flow through it as through the rows' own tokens, so the
        scores and their gradients are those of the rows run whole (tests/agent_runtime/llm/test_choice.py)."""
        decoder, head = lm_parts(causal_lm)
        common = self._shared_prefix(ids, share)
        rest = [p[common:] for p in ids]
        packed = pack_choices(rest, actions, pad_id=self._pad_id, past_lengths=[common] * len(ids), past_width=common)
        fed = common + sum(map(len, rest)) + sum(packed.columns)  # the actions' columns: each distinct prefix once
        if not common:
            return choice_logprobs(decoder, head, packed), fed
        cache = read_only_prefix(decoder, ids[0][:common], len(ids))  # one copy of the prefix's KV, read by every row
        with reading_cache_under_checkpointing(decoder):  # a checkpointed student's layers keep reading it
            return choice_logprobs(decoder, head, packed, past=cache, extend=False), fed

    def _teacher_choice_scores(self, teacher_ids: list[list[int]], actions: list[list[list[int]]]):
        keys = [(tuple(t), tuple(tuple(a) for a in row)) for t, row in zip(teacher_ids, actions)]
        missing = [i for i, key in enumerate(keys) if key not in self._teacher_choices]
        if missing:
            self.model.eval()
            with torch.no_grad(), self.policies.teacher() as teacher:
                scored, fed = self._scored(
                    teacher,
                    [teacher_ids[i] for i in missing],
                    [actions[i] for i in missing],
                    share=self._share_teacher_prefix,
                )
            self.tokens["teacher"] += fed
            for i, scores in zip(missing, scored):  # a separate teacher may run on another device
                self._teacher_choices[keys[i]] = scores.to(self.model.device)
        return [self._teacher_choices[key] for key in keys]

    def _micro_batches(self, prompts: list[Chat], choices: list[list[str]]) -> list[list[int]]:
        """Indices of `prompts` in groups of at most `micro_batch_size` prompts and `micro_batch_tokens` tokens
        (a prompt and its actions; one longer prompt is a group of its own), by length: a group is padded to its
        longest prompt, and a cycle's prompts range from one turn to several."""
        cfg = self.config
        sizes = [
            len(self.render(p)) + sum(len(self.tokenizer.encode(a, add_special_tokens=False)) + 1 for a in options)
            for p, options in zip(prompts, choices)
        ]
        if len(prompts) <= cfg.micro_batch_size and sum(sizes) <= cfg.micro_batch_tokens:
            return [list(range(len(prompts)))]
        groups: list[list[int]] = []
        tokens = 0
        for i in sorted(range(len(prompts)), key=lambda i: sizes[i]):
            if not groups or len(groups[-1]) >= cfg.micro_batch_size or tokens + sizes[i] > cfg.micro_batch_tokens:
                groups.append([])
                tokens = 0
            groups[-1].append(i)
            tokens += sizes[i]
        return groups

    def _choice_loss(
        self, prompts: list[Chat], contexts: list[str], choices: list[list[str]], objective: Objective
    ) -> ChunkedLoss:
        """The objective's choice-policy loss of the batch (mean over its prompts), back-propagated micro-batch
        by micro-batch (`micro_batch_size` prompts per forward); `tokens` counts decisions."""
        cfg = self.config
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + self.steps_done + (self.rank << 40))
        total, loss_sum, kl_sum = len(prompts), 0.0, 0.0
        for part in self._micro_batches(prompts, choices):
            student, teacher = self._choice_scores(
                [prompts[i] for i in part], [contexts[i] for i in part], [choices[i] for i in part]
            )
            share = len(student) / total
            loss = objective.choice_loss(student, teacher, temperature=cfg.temperature, generator=generator) * share
            loss.backward()
            with torch.no_grad():
                kl_sum += (
                    float(
                        choice_divergence(
                            [s.detach() for s in student], teacher, divergence="reverse", temperature=cfg.temperature
                        )
                    )
                    * share
                )
            loss_sum += float(loss.detach())
        return ChunkedLoss(loss=loss_sum, sampled_kl=kl_sum, tokens=total)

    def _share(self, n: int) -> slice:
        """This rank's contiguous share of `n` global items (the first n % world_size ranks take one more)."""
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def _guard(self, loss: float) -> None:
        """Abort before the optimizer step on a NaN/inf, an absurd loss, or repeated spikes."""
        cfg = self.config
        problem = None
        recent = [m["loss"] for m in self.history[-cfg.divergence_window :]]
        spike = len(recent) >= 5 and loss > cfg.divergence_spike_factor * max(
            statistics.median(recent), cfg.divergence_spike_floor
        )
        self._spikes = self._spikes + 1 if spike else 0
        if not math.isfinite(loss):
            problem = f"loss is {loss}"
        elif loss > cfg.divergence_max_loss:
            problem = f"loss {loss:.3g} exceeds divergence_max_loss={cfg.divergence_max_loss}"
        elif self._spikes >= cfg.divergence_patience:
            problem = (
                f"{self._spikes} consecutive losses above {cfg.divergence_spike_factor}x the recent median "
                f"{statistics.median(recent):.3g}"
            )
        if problem:
            self.optimizer.zero_grad(set_to_none=True)
            raise DivergenceError(f"step {self.steps_done}: {problem}; aborting the run (roll the adapter back)")

    def train(
        self,
        prompt_source: Sequence[Chat] | Iterable[Chat],
        context_source: ContextSource,
        steps: int | None = None,
        on_step: Callable[[dict], None] | None = None,
        choices: Sequence[list[str]] | None = None,
        anchors: Sequence[Chat] = (),
        anchor_choices: Sequence[list[str]] | None = None,
    ) -> list[dict]:
        """Run `steps` (default config.steps) optimizer steps; returns the per-step metrics.

        `prompt_source`: a sequence of chats (reshuffled every pass with the config seed) or an iterator of chats (drawn
        in order; training stops early when it cannot fill a batch). `context_source`: one string for every sample
        (system-prompt distillation, or one lesson set), a sequence of strings (one drawn at random per sample: the
        lesson pools), `PromptContexts` (each prompt's own pools: its environment's lessons), or a callable
        `chat -> context`. `on_step(metrics)` is called after each step (log it, save, stop
        by raising); under data parallel on rank 0 only (an exception there ends rank 0, and the launcher then stops the
        others). A NaN or diverging loss raises `DivergenceError` (on every rank at once). `choices`: one action set per
        prompt of a sequence `prompt_source`: the choice policy is distilled. `anchors` (with `anchor_choices` when
        `choices` is given): prompts of other tasks, mixed into the sequence, whose teacher has no context: the
        start-of-cycle policy itself, so that there the student keeps what it did.

        With `validation_fraction` (a sequence source only) a seeded share of the prompts is held back: their
        exact KL to the teacher is measured before the first step and every `eval_every` steps (`val_kl` in
        the step's metrics, None between measurements), the run stops after `patience` measurements without a
        new best, and the weights of the best measurement are restored at the end (`best`, `stopped_early`).
        """
        cfg = self.config
        rng = random.Random(cfg.seed)
        if choices is not None:
            if not isinstance(prompt_source, Sequence) or len(choices) != len(prompt_source):
                raise ValueError("choices needs a sequence of prompts and one action set per prompt")
            prompt_source = list(zip(prompt_source, choices))
        pick = context_picker(context_source, rng)
        extra: list = []  # anchors drawn as their own share of every batch (`anchor_share`)
        if anchors:
            prompt_source, pick, extra = with_anchors(prompt_source, pick, anchors, choices, anchor_choices)
            if cfg.anchor_share is None:
                prompt_source, extra = [*prompt_source, *extra], []
        validation = None
        if cfg.validation_fraction > 0 and isinstance(prompt_source, Sequence) and len(prompt_source) >= 2:
            prompt_source, held = split_validation(list(prompt_source), cfg.validation_fraction, cfg.seed)
            held_chats = [item[0] if choices is not None else item for item in held]
            validation = (
                held_chats,
                [pick(chat) for chat in held_chats],
                [item[1] for item in held] if choices is not None else None,
            )
        # a sequence smaller than a batch is one batch: every step sees all of it (the exact gradient)
        batch_size = (
            min(cfg.batch_size, len(prompt_source) + len(extra))
            if isinstance(prompt_source, Sequence)
            else cfg.batch_size
        )
        prompts = prompt_stream(prompt_source, rng)
        anchored = prompt_stream(extra, random.Random(f"anchors:{cfg.seed}")) if extra else None
        if validation is not None:
            self._validate(validation)
        out = []
        for index in range(cfg.steps if steps is None else steps):
            k = anchors_in_step(index, batch_size, cfg.anchor_share) if anchored else 0
            batch = list(itertools.islice(prompts, batch_size - k)) + list(itertools.islice(anchored or (), k))
            if len(batch) < batch_size:  # an iterator ran dry: stop at the last full batch
                break
            sets = None
            if choices is not None:
                batch, sets = [chat for chat, _ in batch], [options for _, options in batch]
            metrics = self.step(batch, [pick(chat) for chat in batch], sets)
            metrics["val_kl"] = None
            if validation is not None and self.steps_done % cfg.eval_every == 0:
                metrics["val_kl"] = self._validate(validation)
            out.append(metrics)
            if on_step is not None and self.rank == 0:
                on_step(metrics)
            if validation is not None and cfg.patience and self._since_best() >= cfg.patience:
                self.stopped_early = True
                break
        if self._best_state is not None and self.best["step"] != self.steps_done:
            with torch.no_grad():
                for param, saved in zip(self._params, self._best_state):
                    param.copy_(saved)
        return out

    def _validate(self, validation) -> float:
        """Measure the held-back prompts' KL; keep the weights when it is a new best (by `min_improvement`)."""
        chats, contexts, sets = validation
        value = statistics.fmean(self.kl_per_prompt(chats, contexts, sets))
        self.validation.append({"step": self.steps_done, "val_kl": value})
        if self.best is None or value < (1.0 - self.config.min_improvement) * self.best["val_kl"]:
            self.best = {"step": self.steps_done, "val_kl": value}
            self._best_state = [p.detach().clone() for p in self._params]
        return value

    def _since_best(self) -> int:
        """Validation measurements since the best one."""
        return sum(1 for v in self.validation if v["step"] > self.best["step"])

    # -- evaluation and saving ---------------------------------------------------------------------------
    @torch.no_grad()
    def kl_per_prompt(
        self, prompts: list[Chat], contexts: list[str], choices: list[list[str]] | None = None
    ) -> list[float]:
        """Exact (full-vocabulary) reverse KL per response token, student without context vs teacher with it,
        on one student sample per prompt drawn with the fixed `eval_seed`; one value per prompt. With `choices`,
        the exact reverse KL between the two choice policies over each prompt's action set. Under data
        parallel the batches are dealt out to the ranks round-robin and the values summed, so every rank
        returns the single-process values."""
        if len(prompts) != len(contexts):
            raise ValueError(f"{len(prompts)} prompts but {len(contexts)} contexts; give one context per prompt")
        values = torch.zeros(len(prompts), dtype=torch.float64, device=self.model.device)
        if choices is not None:  # by length, as a step's micro-batches
            for index, part in enumerate(self._micro_batches(prompts, choices)):
                if index % self.world_size != self.rank:
                    continue
                student, teacher = self._choice_scores(
                    [prompts[i] for i in part], [contexts[i] for i in part], [choices[i] for i in part]
                )
                for i, s, t in zip(part, student, teacher):
                    values[i] = float(
                        choice_divergence([s], [t], divergence="reverse", temperature=self.config.temperature)
                    )
        for index, start in enumerate(range(0, len(prompts), self.config.batch_size)):
            if choices is not None or index % self.world_size != self.rank:
                continue
            chats = prompts[start : start + self.config.batch_size]
            student_ids = [self.render(p) for p in chats]
            teacher_ids = [self.render(with_context(p, c)) for p, c in zip(chats, contexts[start:])]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.config.eval_seed + start)
                responses = self._sample_student(student_ids)
            teacher_hidden, teacher_head = self._teacher_hidden(teacher_ids, responses)
            self.tokens["teacher"] += sum(len(t) + len(r) for t, r in zip(teacher_ids, responses))
            self.tokens["scored"] += sum(len(s) + len(r) for s, r in zip(student_ids, responses))
            self.model.eval()
            hidden = response_hidden(self._student_lm, student_ids, responses, pad_id=self._pad_id)
            head = lm_parts(self._student_lm)[1]
            for row in range(len(chats)):
                mask = torch.zeros(1, hidden.shape[1], device=hidden.device)
                mask[0, : len(responses[row])] = 1
                result = chunked_topk_divergence(
                    hidden[row : row + 1],
                    teacher_hidden[row : row + 1],
                    mask,
                    student_head=self.policies.fit_head(head),
                    teacher_head=teacher_head,
                    k=head.weight.shape[0],
                    temperature=self.config.temperature,
                    chunk_size=self.config.chunk_size,
                    backward=False,
                )
                values[start + row] = result.loss
        if self.world_size > 1:
            torch.distributed.all_reduce(values)
        return values.tolist()

    def evaluate_kl(
        self, prompts: list[Chat], contexts: list[str] | str, choices: list[list[str]] | None = None
    ) -> float:
        """Held-out mean reverse KL(student without context || teacher with it), per response token or, with
        `choices`, per decision; lower is better."""
        if isinstance(contexts, str):
            contexts = [contexts] * len(prompts)
        return statistics.fmean(self.kl_per_prompt(prompts, contexts, choices))

    def save_adapter(self, path: str | Path, *, overwrite: bool = False, metadata: dict | None = None) -> Path:
        """Write the trained adapter (or the full model when full_finetune) atomically to `path`. Under data
        parallel rank 0 writes it (the ranks hold the same weights) and every rank returns once it is written."""
        path = Path(path)
        if self.rank == 0:
            self._write(path, overwrite=overwrite, metadata=metadata)
        if self.world_size > 1:
            torch.distributed.barrier()
        return path

    def _write(self, path: Path, *, overwrite: bool, metadata: dict | None) -> None:
        with atomic_directory(path, overwrite=overwrite) as partial:
            if self.config.full_finetune:
                self.model.save_pretrained(partial)
                self.tokenizer.save_pretrained(partial)
            else:
                self.model.save_pretrained(partial, selected_adapters=["default"])
            write_metadata(
                partial,
                {
                    "config": self.config.model_dump(),
                    "steps": self.steps_done,
                    "parent_adapter": self.parent_adapter,
                    "base_model": getattr(self._student_lm.config, "_name_or_path", None),
                    "last_metrics": self.history[-1] if self.history else None,
                    **(metadata or {}),
                },
            )
