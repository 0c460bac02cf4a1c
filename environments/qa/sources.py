"""Where `qa/medmcqa` and `qa/safety` get their questions: a local file, or the `datasets` library.

A local JSONL, JSON or Parquet file is given as `path` (the train split) and, optionally, `eval_path` (the eval
split; without it every tenth row of `path` is held out for eval). Without `path` the sets come from the
`datasets` library, when it is installed and has the data (in its cache, or from the Hugging Face Hub where
that is reachable): the OPCD paper's own exports, `ytz20/sys_medmcqa_{train,test}` and
`ytz20/sys_safety_{train,test}` (the files microsoft/LMOps' opcd/tools/prepare_data.py fetches), train for
train and test for eval. Neither source has a validation split: validation is carved out of train
(`n_validation` questions, evenly spaced; see `environments.qa.choice.ChoiceEnv`). Neither available is an `EnvError` that names both ways out; nothing is fetched at
import, only when an environment is made.

Row layouts, detected per row:
- the paper's exports: `content` (or `prompt` / `messages`), a string or a chat (a list of {role, content};
  its user messages are the question, and a system message, if any, is left out: the student answers
  without one), and `answer`, a letter A-D (MedMCQA) or yes/no (safety). The paper's prompts state the
  answer format themselves.
- MedMCQA's own layout (the Hugging Face copy, openlifescienceai/medmcqa): `question`, the options `opa`,
  `opb`, `opc`, `opd` (or `options`: a list of four, or a mapping A-D), and `answer` (a letter) or `cop`, the
  correct option's index. `cop` is 0-3 in the Hugging Face copy and 1-4 in the original release; a file is
  read as 1-based when its indices include 4 and not 0, 0-based in the opposite case, and is refused when
  it does not show which (give `answer` letters then). MedMCQA's public test split has no answers (`cop`
  -1): evaluate on its validation split. We add the answer format to these questions.
- safety: `question` and `answer` (yes/no, or a boolean), with the answer format added.
Task ids are "<split>-<row>", stable for a given file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from environments.base import EnvError
from environments.qa.choice import ChoiceEnv

PROMPT_FIELDS = ("content", "prompt", "messages")
LETTERS = ("A", "B", "C", "D")
YES_NO = ("yes", "no")
HUB = {
    "medmcqa": ("ytz20/sys_medmcqa_train", "ytz20/sys_medmcqa_test"),
    "safety": ("ytz20/sys_safety_train", "ytz20/sys_safety_test"),
}
HOLDOUT = 10
LETTER_FORMAT = "Give the letter of the correct option in the form <answer>X</answer>."
YES_NO_FORMAT = "Answer yes or no, in the form <answer>yes</answer> or <answer>no</answer>."


class QADataUnavailableError(EnvError, FileNotFoundError):
    """Neither a local file nor the `datasets` library could provide the questions."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a local .jsonl, .json or .parquet file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise QADataUnavailableError(f"no such file: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise QADataUnavailableError(
                f"reading {path} needs pyarrow (pip install pyarrow), or convert it to JSONL"
            ) from None
        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            data = json.loads(text)
            return data if isinstance(data, list) else list(data.values())
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise EnvError(f"{path} is not valid JSON{'' if path.suffix == '.json' else ' lines'}: {exc}") from None


def _prompt_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(isinstance(m, dict) for m in value):
        text = "\n\n".join(str(m.get("content", "")) for m in value if m.get("role", "user") == "user")
    else:
        raise EnvError(
            f"{where}: the prompt must be a string or a list of {{role, content}} messages, got {type(value).__name__}"
        )
    if not text.strip():
        raise EnvError(f"{where}: the prompt is empty")
    return text


def _options(row: dict[str, Any], where: str) -> list[str]:
    if all(key in row for key in ("opa", "opb", "opc", "opd")):
        return [str(row[key]) for key in ("opa", "opb", "opc", "opd")]
    options = row.get("options")
    if isinstance(options, dict):
        by_letter = {str(k).strip().upper(): str(v) for k, v in options.items()}
        if set(by_letter) == set(LETTERS):
            return [by_letter[letter] for letter in LETTERS]
    elif isinstance(options, list) and len(options) == len(LETTERS):
        return [str(o) for o in options]
    raise EnvError(
        f"{where}: a MedMCQA question needs four options (opa..opd, or options: a list of four or "
        f"a mapping A-D); fields: {', '.join(row)}"
    )


def _cop_base(rows: list[dict[str, Any]], where: str) -> int:
    """Whether `cop` counts options from 0 or from 1 in this file (see the module docstring)."""
    indices = {row["cop"] for row in rows if "answer" not in row and "cop" in row} - {-1}
    if not indices or (0 in indices and 4 not in indices):
        return 0
    if 4 in indices and 0 not in indices:
        return 1
    raise EnvError(
        f"{where}: cannot tell whether cop counts options from 0 or from 1 (indices seen: "
        f"{sorted(indices, key=str)}); give answer letters A-D instead"
    )


def _letter(row: dict[str, Any], base: int, where: str) -> str:
    if "answer" in row:
        letter = str(row["answer"]).strip().upper()
        if letter not in LETTERS:
            raise EnvError(f"{where}: answer {row['answer']!r} is not one of {', '.join(LETTERS)}")
        return letter
    if "cop" not in row:
        raise EnvError(f"{where}: no answer (give `answer`, a letter A-D, or `cop`); fields: {', '.join(row)}")
    index = row["cop"]
    if index == -1:
        raise EnvError(
            f"{where}: no answer (cop -1): MedMCQA's test split has no public answers; evaluate on its validation split"
        )
    if not isinstance(index, int) or not 0 <= index - base < len(LETTERS):
        raise EnvError(f"{where}: cop {index!r} is not an option index")
    return LETTERS[index - base]


def medmcqa_questions(rows: list[dict[str, Any]], origin: str) -> list[tuple[str, str]]:
    """(question, gold letter) of MedMCQA rows in any of the layouts above."""
    base = _cop_base(rows, origin)
    questions = []
    for number, row in enumerate(rows):
        where = f"{origin}: row {number}"
        prompt_field = next((f for f in PROMPT_FIELDS if f in row), None)
        if prompt_field is not None:
            text = _prompt_text(row[prompt_field], where)
        elif "question" in row:
            listed = "\n".join(f"{letter}. {option}" for letter, option in zip(LETTERS, _options(row, where)))
            text = f"{row['question']}\n\n{listed}\n\n{LETTER_FORMAT}"
        else:
            raise EnvError(
                f"{where}: no question (tried {', '.join(PROMPT_FIELDS)}, question); fields: {', '.join(row)}"
            )
        questions.append((text, _letter(row, base, where)))
    return questions


def safety_questions(rows: list[dict[str, Any]], origin: str) -> list[tuple[str, str]]:
    """(question, gold yes/no) of safety rows."""
    questions = []
    for number, row in enumerate(rows):
        where = f"{origin}: row {number}"
        prompt_field = next((f for f in PROMPT_FIELDS if f in row), None)
        if prompt_field is not None:
            text = _prompt_text(row[prompt_field], where)
        elif "question" in row:
            text = f"{row['question']}\n\n{YES_NO_FORMAT}"
        else:
            raise EnvError(
                f"{where}: no question (tried {', '.join(PROMPT_FIELDS)}, question); fields: {', '.join(row)}"
            )
        if "answer" not in row:
            raise EnvError(f"{where}: no answer (yes or no); fields: {', '.join(row)}")
        answer = row["answer"]
        label = ("yes" if answer else "no") if isinstance(answer, bool) else str(answer).strip().lower()
        if label not in YES_NO:
            raise EnvError(f"{where}: answer {answer!r} is not yes or no")
        questions.append((text, label))
    return questions


def _hub_rows(name: str) -> list[dict[str, Any]]:
    import datasets  # raises ImportError when not installed

    return list(datasets.load_dataset(name, split="train"))


def _questions(kind: str, path: str | None, eval_path: str | None) -> tuple[dict[str, list[tuple[str, str]]], str]:
    parse = medmcqa_questions if kind == "medmcqa" else safety_questions
    if path is not None:
        train = parse(read_rows(path), str(path))
        if eval_path is not None:
            return {"train": train, "eval": parse(read_rows(eval_path), str(eval_path))}, str(path)
        return (
            {
                "train": [q for i, q in enumerate(train) if i % HOLDOUT != HOLDOUT - 1],
                "eval": [q for i, q in enumerate(train) if i % HOLDOUT == HOLDOUT - 1],
            },
            str(path),
        )
    if eval_path is not None:
        raise EnvError(f"qa/{kind}: eval_path= needs path= too (the train split)")
    names = dict(zip(("train", "eval"), HUB[kind]))
    try:
        rows = {split: _hub_rows(name) for split, name in names.items()}
    except Exception as exc:  # ImportError, no cache and no Hub, missing dataset: all mean "no data here"
        raise QADataUnavailableError(
            f"qa/{kind} needs its questions: the `datasets` library could not load {names['train']!r} and "
            f"{names['eval']!r} ({type(exc).__name__}: {exc}). Install `datasets` with those sets in its cache "
            f"(or the Hugging Face Hub reachable), or pass path=/local/train.jsonl (and eval_path=/local/test.jsonl); "
            f"JSONL, JSON or Parquet."
        ) from exc
    return {split: parse(rows[split], name) for split, name in names.items()}, ", ".join(names.values())


def medmcqa(
    *,
    path: str | None = None,
    eval_path: str | None = None,
    answer_tag_only: bool = False,
    n_validation: int | None = None,
    max_steps: int | None = None,
    cache_dir: str | None = None,
) -> ChoiceEnv:
    """MedMCQA medical multiple-choice questions (options A-D) from a local file or the paper's exports.

    `answer_tag_only` grades only `<answer>` tags, as the paper did. `cache_dir` is accepted for uniformity with
    the other built-ins: the `datasets` library keeps its own cache.
    """
    questions, origin = _questions("medmcqa", path, eval_path)
    return ChoiceEnv(
        "qa/medmcqa",
        f"MedMCQA medical multiple-choice questions ({origin})",
        questions,
        LETTERS,
        "Choose the correct option: A, B, C or D.",
        source=origin,
        answer_tag_only=answer_tag_only,
        n_validation=n_validation,
        max_steps=max_steps,
    )


def safety(
    *,
    path: str | None = None,
    eval_path: str | None = None,
    answer_tag_only: bool = False,
    n_validation: int | None = None,
    max_steps: int | None = None,
    cache_dir: str | None = None,
) -> ChoiceEnv:
    """The OPCD paper's safety set (yes/no judgements) from a local file or the paper's exports.

    `answer_tag_only` grades only `<answer>` tags, as the paper did. `cache_dir` is accepted for uniformity with
    the other built-ins: the `datasets` library keeps its own cache.
    """
    questions, origin = _questions("safety", path, eval_path)
    return ChoiceEnv(
        "qa/safety",
        f"Safety yes/no judgements ({origin})",
        questions,
        YES_NO,
        "Answer yes or no.",
        source=origin,
        answer_tag_only=answer_tag_only,
        n_validation=n_validation,
        max_steps=max_steps,
    )
