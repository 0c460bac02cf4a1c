"""Fixed math problem sets: `math/gsm8k`, `math/math`, `math/dapo` (Hugging Face or local files) and
`math/champ` (offline, from the `champ-dataset` wheel).

The dataset-backed sets read the Hugging Face `datasets` library when it is installed and can reach
its data; otherwise (or when the caller prefers) they read a local JSONL or Parquet file given as
`path`. Neither available is a clear error that says both ways out. Field names are detected
(question/problem/prompt, answer/solution/ground_truth) or given explicitly.

Splits: where the source has a test split we use it for eval (GSM8K, MATH); DAPO-Math-17k has only
train (repeated many times in the hub copy, so rows are de-duplicated) and CHAMP has one set, so a
fixed, hash-free rule holds out every tenth (DAPO) or fifth (CHAMP) problem. A single local file is
split the same way (every tenth row to eval) unless `eval_path` names a separate eval file. None of these
sets has a validation split of its own, so validation is carved out of the train problems (after that
hold-out): `n_validation` of them, evenly spaced over the list (default: a tenth, at most 200), which train
then no longer hands out (`environments.episodic.carve_validation`). Task ids are "<split>-<row>", stable
for a given data file: "train-<row>" and "eval-<row>" name the rows they named before validation existed
(train's ids skip the carved rows), "validation-<i>" the i-th carved row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.base import SPLITS, EnvError
from environments.episodic import DatasetSplits
from environments.math.base import MathEnv, offline_package

QUESTION_FIELDS = ("question", "problem", "prompt", "query")
ANSWER_FIELDS = ("answer", "solution", "ground_truth", "gold", "final_answer")


class MathDataUnavailableError(EnvError, FileNotFoundError):
    """Neither the `datasets` library nor a local file could provide the problems."""


@dataclass(frozen=True)
class HubSource:
    """Where a problem set lives on the Hugging Face Hub and how its rows read."""

    name: str
    config: str | None
    train_split: str
    eval_split: str | None  # None: hold out every `holdout`-th training row
    holdout: int = 10


HUB_SOURCES = {
    "gsm8k": HubSource("openai/gsm8k", "main", "train", "test"),
    "math": HubSource("DigitalLearningGmbH/MATH-lighteval", "default", "train", "test"),
    "dapo": HubSource("BytedTsinghua-SIA/DAPO-Math-17k", None, "train", None),
}


def _text(value: Any) -> str:
    """Question/answer cells come as str, numbers, chat message lists (DAPO) or {"ground_truth": ..} dicts."""
    if isinstance(value, list):  # [{"role": "user", "content": ...}]
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in value)
    if isinstance(value, dict):
        for key in ("ground_truth", "content", "text", "answer"):
            if key in value:
                return _text(value[key])
    return str(value)


def _pick(row: dict[str, Any], explicit: str | None, candidates: tuple[str, ...], what: str) -> str:
    if explicit is not None:
        if explicit not in row:
            raise EnvError(f"rows have no {what} field {explicit!r}; fields: {', '.join(row)}")
        return _text(row[explicit])
    if what == "answer" and "reward_model" in row:  # DAPO layout
        return _text(row["reward_model"])
    for name in candidates:
        if name in row:
            return _text(row[name])
    raise EnvError(
        f"cannot find the {what} in rows with fields {', '.join(row)}; "
        f"pass {what}_field= (tried {', '.join(candidates)})"
    )


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a local .jsonl/.json or .parquet file."""
    path = Path(path).expanduser()
    if not path.exists():
        raise MathDataUnavailableError(f"no such file: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise MathDataUnavailableError(
                f"reading {path} needs pyarrow (pip install pyarrow), or convert it to JSONL"
            ) from None
        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return data if isinstance(data, list) else list(data.values())
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _hub_rows(source: HubSource, split: str) -> list[dict[str, Any]]:
    import datasets  # raises ImportError when not installed

    return list(datasets.load_dataset(source.name, source.config, split=split))


def _dedupe(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen, unique = set(), []
    for problem in problems:
        if problem[0] not in seen:
            seen.add(problem[0])
            unique.append(problem)
    return unique


def _holdout(problems: list[tuple[str, str]], every: int) -> dict[str, list[tuple[str, str]]]:
    return {
        "train": [p for i, p in enumerate(problems) if i % every != every - 1],
        "eval": [p for i, p in enumerate(problems) if i % every == every - 1],
    }


class ProblemSetEnv(MathEnv):
    """A fixed list of (question, gold) problems for train and for eval as one-step episodes; validation is
    `n_validation` train problems carved out of train (see the module docstring)."""

    splits = SPLITS

    def __init__(
        self,
        env_id: str,
        description: str,
        problems: dict[str, list[tuple[str, str]]],
        *,
        n_validation: int | None = None,
        max_steps: int | None = None,
    ) -> None:
        super().__init__(env_id, description, max_steps=max_steps)
        for split, rows in problems.items():
            if not rows:
                raise EnvError(f"{env_id}: the {split} split has no problems")
        self._problems = problems
        self._splits = DatasetSplits(env_id, len(problems["train"]), len(problems["eval"]), n_validation)

    def _tasks(self, split: str) -> Sequence[str]:
        return self._splits.tasks[split]

    def problem(self, task_id: str) -> tuple[str, str]:
        rows, row = self._splits.row(task_id)
        return self._problems[rows][row]


def dataset_env(
    kind: str,
    *,
    path: str | None = None,
    eval_path: str | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
    n_validation: int | None = None,
    max_steps: int | None = None,
    cache_dir: str | None = None,
) -> ProblemSetEnv:
    """Build math/<kind> from a local file (`path`, optional `eval_path`) or else the Hugging Face hub.

    `cache_dir` is passed to nothing here: the `datasets` library keeps its own cache (HF_HOME).
    """
    source = HUB_SOURCES[kind]

    def problems_of(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [
            (_pick(r, question_field, QUESTION_FIELDS, "question"), _pick(r, answer_field, ANSWER_FIELDS, "answer"))
            for r in rows
        ]

    if path is not None:
        train = _dedupe(problems_of(read_rows(path)))
        problems = (
            {"train": train, "eval": _dedupe(problems_of(read_rows(eval_path)))} if eval_path else _holdout(train, 10)
        )
        origin = str(path)
    else:
        try:
            train = _dedupe(problems_of(_hub_rows(source, source.train_split)))
            problems = (
                {"train": train, "eval": _dedupe(problems_of(_hub_rows(source, source.eval_split)))}
                if source.eval_split
                else _holdout(train, source.holdout)
            )
        except Exception as exc:  # ImportError, offline hub, missing dataset: all mean "no data here"
            raise MathDataUnavailableError(
                f"math/{kind} needs its problems: the `datasets` library could not load {source.name!r} "
                f"({type(exc).__name__}: {exc}). Install `datasets` with access to the Hugging Face Hub, "
                f"or pass path=/local/file.jsonl (or .parquet) with question/answer fields."
            ) from exc
        origin = source.name
    names = {
        "gsm8k": "GSM8K grade-school word problems",
        "math": "MATH competition problems",
        "dapo": "DAPO-Math-17k problems",
    }
    return ProblemSetEnv(
        f"math/{kind}", f"{names[kind]} ({origin})", problems, n_validation=n_validation, max_steps=max_steps
    )


def gsm8k(
    *,
    path: str | None = None,
    eval_path: str | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
    n_validation: int | None = None,
    max_steps: int | None = None,
    cache_dir: str | None = None,
) -> ProblemSetEnv:
    """GSM8K (openai/gsm8k train/test), or a local file via path=."""
    return dataset_env(
        "gsm8k",
        path=path,
        eval_path=eval_path,
        question_field=question_field,
        answer_field=answer_field,
        n_validation=n_validation,
        max_steps=max_steps,
        cache_dir=cache_dir,
    )


def competition_math(
    *,
    path: str | None = None,
    eval_path: str | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
    n_validation: int | None = None,
    max_steps: int | None = None,
    cache_dir: str | None = None,
) -> ProblemSetEnv:
    """MATH (Hendrycks et al., train/test), or a local file via path=."""
    return dataset_env(
        "math",
        path=path,
        eval_path=eval_path,
        question_field=question_field,
        answer_field=answer_field,
        n_validation=n_validation,
        max_steps=max_steps,
        cache_dir=cache_dir,
    )


def dapo(
    *,
    path: str | None = None,
    eval_path: str | None = None,
    question_field: str | None = None,
    answer_field: str | None = None,
    n_validation: int | None = None,
    max_steps: int | None = None,
    cache_dir: str | None = None,
) -> ProblemSetEnv:
    """DAPO-Math-17k (de-duplicated; every tenth problem held out for eval), or a local file via path=."""
    return dataset_env(
        "dapo",
        path=path,
        eval_path=eval_path,
        question_field=question_field,
        answer_field=answer_field,
        n_validation=n_validation,
        max_steps=max_steps,
        cache_dir=cache_dir,
    )


def champ(
    *, n_validation: int | None = None, max_steps: int | None = None, cache_dir: str | None = None
) -> ProblemSetEnv:
    """CHAMP competition problems from the champ-dataset wheel (offline; every fifth held out for eval).

    Gold answers that read "X, or equivalently Y" are graded against Y (the closed form).
    `cache_dir` is accepted for uniformity with the other built-ins (nothing is cached).
    """
    dataset = offline_package("champ_dataset", "champ-dataset", "math/champ").load("v0")
    problems = [(p.text, p.answer.split(", or equivalently")[-1].strip()) for _, p in sorted(dataset.problems.items())]
    return ProblemSetEnv(
        "math/champ",
        "CHAMP competition math problems (offline)",
        _holdout(problems, 5),
        n_validation=n_validation,
        max_steps=max_steps,
    )
