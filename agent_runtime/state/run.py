"""`Run`: one run as its phases see it, built once by whoever runs them (the loop, `agent-runtime distill`, a Ray
learner) and passed down instead of the four values every phase needs.

It holds the run's config, workdir, store and id, and what is derived from them once: the held-out task set
(`agent_runtime.evaluation.heldout`) and the pool its environments are built into and lent from (`EnvPool`: specs,
task lists and started game instances kept between a cycle's 5-9 evaluations and the gate's; by default the
process's pool). The phases take a `Run` and the backend they act with and play their evaluations through
`Run.evaluate`; they import nothing of the loop.

`Run.evaluate` also remembers what it played: greedy evaluation with fixed seeds is deterministic, so the same
policy on the same games with the same prompt plays the same episodes, and a run asks for the same ones several
times (the lesson gate's 12 train games without and with a person's lesson; then the next extraction's trials start
from the same live lessons; then the cycle's validation plays the parent on the same games, without and with them).
An environment's result is reused when all of these are the same: the backend object and the weights it acts with
(`adapter_fingerprint`: the base model, or an adapter by its tensors, so a rolled-back name reused by another
adapter is not confused), the whole environment entry, the split, the tasks (`first`, how many), the lessons in
scope for that environment, the system-prompt context and the slots. It is not reused, and the games are played,
for a backend that cannot say which weights it acts with, an adapter without a fingerprint, sampling
(`evaluation.temperature` above 0), or a caller that reads the episodes' turns (`on_record`). At most
`PLAYED_ENTRIES` results are kept (the least recently used go first).

Every prompt `Run.evaluate` plays holds what PLAY's would: the lessons in scope for its environment, fitted to the
run's lesson budget for its goal and first observation (`lesson_budget`, counted with the run model's tokenizer as
`config_token_counter` counts it; `distill.lessons.budget`), so a gate, an assessment or a cycle's evaluation
measures the agent as it acts.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from agent_runtime.checkpoints import resolve_model
from agent_runtime.config import EnvEntry, ModelConfig, RunConfig
from agent_runtime.evaluation import EnvPool, EvalResult, env_pool, evaluate
from agent_runtime.evaluation.evaluator import entry_key
from agent_runtime.evaluation.heldout import HeldOut, held_out
from agent_runtime.llm.base import BackendError, FingerprintBackend
from distill.lessons.budget import LessonBudget, count_words
from distill.lessons.scope import in_scope_lessons
from memory import ExperienceStore
from modelkit.chat_tokens import encode_text

PLAYED_ENTRIES = 512  # environment results `Run.evaluate` keeps (a few KB each)


def config_token_counter(model: ModelConfig) -> Callable[[str], int]:
    """Tokens of a plain text as the acting model's tokenizer counts it in a prompt (special-token text in a lesson
    is text there, `encode_text`), from the tokenizer alone (no weights are loaded): whitespace words for the
    scripted backend and a chat model without a `tokenizer` option."""
    if model.backend == "scripted" or (model.backend == "chat" and not model.options.get("tokenizer")):
        return count_words
    from transformers import AutoTokenizer

    name = model.options["tokenizer"] if model.backend == "chat" else model.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(name), local_files_only=True)
    except OSError as exc:
        raise BackendError(f"cannot load the tokenizer of {name!r} offline to count the lesson budget: {exc}") from None
    return lambda text: len(encode_text(tokenizer, text))


@dataclass
class Run:
    config: RunConfig
    workdir: Path
    store: ExperienceStore
    id: int
    pool: EnvPool = field(default_factory=env_pool)
    _played: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False, compare=False)
    _backends: weakref.WeakKeyDictionary = field(  # backend -> its token in the keys (never reused)
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False, compare=False
    )
    _tokens: itertools.count = field(default_factory=itertools.count, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)

    @cached_property
    def held(self) -> HeldOut:
        """The held-out evaluation tasks, by task id and first observation (kept out of every learning input)."""
        return held_out(self.config, self.workdir)

    @cached_property
    def model_path(self) -> str:
        """What the run's model name resolves to (`resolve_model`), once per run: a cycle's trainer, its teacher
        check and the adapter probe all load this."""
        return resolve_model(self.config.model.name)

    @cached_property
    def families(self) -> dict[str, str]:
        """Each environment's prompt family by id (what a `family:NAME` lesson scope names)."""
        specs, _, _ = self.pool.envs(self.config, self.workdir, "train")
        return {spec.env_id: spec.family for spec in specs}

    @cached_property
    def lesson_budget(self) -> LessonBudget:
        """What one prompt holds of the lessons in scope (`lessons.budget_tokens`, `lessons.context_lessons`), the most
        relevant by the store's lesson index: PLAY's selection (`LessonContexts`) and every evaluation's."""
        return LessonBudget.from_settings(self.config.lessons, config_token_counter(self.config.model), self.store)

    def played_envs(self) -> list[str]:
        """The environments of the run it has played an episode of (a cycle's no-regression check covers each)."""
        return [e.id for e in self.config.envs if self.store.episodes(self.id, env_id=e.id, limit=1)]

    def evaluate(self, backend, *, envs: list[EnvEntry] | None = None, **kwargs) -> list[EvalResult]:
        """`agent_runtime.evaluation.evaluate` on this run's environments (or `envs` instead), from its pool, with the
        run's lesson budget (`budget`: another); an environment whose result this run already played (see the module
        docstring) is not played again."""
        if kwargs.get("lessons"):
            kwargs.setdefault("budget", self.lesson_budget)
        if envs is not None:  # entries or their dicts, validated as the config's own
            envs = [EnvEntry.model_validate(e, from_attributes=True) for e in envs]
        entries = list(self.config.envs if envs is None else envs)
        keys = self._played_keys(backend, entries, kwargs)
        if keys is None:
            return self._play(backend, entries, kwargs)
        missing = [i for i, key in enumerate(keys) if key not in self._played]
        # one result per entry, in the entries' order (two entries may share an id: other keyword arguments)
        played = dict(zip(missing, self._play(backend, [entries[i] for i in missing], kwargs))) if missing else {}
        out = []
        for i, key in enumerate(keys):
            result = played.get(i)
            if result is None:
                result = self._played[key]
                self._played.move_to_end(key)
            else:
                self._played[key] = result
            out.append(EvalResult(result.env_id, copy.deepcopy(result.episodes)))
        while len(self._played) > PLAYED_ENTRIES:
            self._played.popitem(last=False)
        return out

    def _play(self, backend, entries: list[EnvEntry], kwargs: dict) -> list[EvalResult]:
        config = self.config.model_copy(update={"envs": entries})
        return evaluate(config, self.workdir, backend, pool=self.pool, **kwargs)

    def _played_keys(self, backend, entries: list[EnvEntry], kwargs: dict) -> list[tuple] | None:
        """Each entry's key in what `evaluate` remembers, or None where its result may not be reused."""
        if self.config.evaluation.temperature > 0 or kwargs.get("on_record") is not None:
            return None
        if not isinstance(backend, FingerprintBackend):
            return None
        weights = backend.adapter_fingerprint()
        if weights is None and getattr(backend, "active_adapter", None) is not None:
            return None  # an adapter the backend cannot fingerprint: its weights are not known to be the same
        try:
            token = self._backends.get(backend)
            if token is None:
                token = self._backends[backend] = next(self._tokens)
        except TypeError:  # not weakly referable: no way to tell it from a later object at the same address
            return None
        split = kwargs.get("split", "eval")
        tasks = (kwargs.get("first", 0), kwargs.get("episodes_per_env") or self.config.evaluation.episodes_per_env)
        lessons = kwargs.get("lessons") or []
        budget = kwargs.get("budget")
        specs, _, _ = self.pool.envs(self.config.model_copy(update={"envs": entries}), self.workdir, split)
        family = {spec.env_id: spec.family for spec in specs}
        slots = kwargs.get("slots") or self.config.runtime.slots
        return [
            (
                token,
                weights,
                entry_key(entry, self.workdir, split, whole=True),
                tasks,
                _shown_key(in_scope_lessons(lessons, entry.id, family.get(entry.id)), budget),
                kwargs.get("context"),
                slots,
            )
            for entry in entries
        ]


def _shown_key(lessons: list, budget: LessonBudget | None) -> tuple:
    """What decides the lessons an environment's prompts show: their texts when they all fit, else also what the
    budget chooses by (their ids and measured gains, and its limits)."""
    texts = tuple(x.text for x in lessons)
    return texts if budget is None or budget.fits(texts) else (tuple(lessons), budget.limits)
