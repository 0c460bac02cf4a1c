"""One-step questions with a fixed set of answers, and the grader that reads the answer out of a reply.

`ChoiceEnv` holds a list of (question, gold label) per split: the observation is the question, the action the
whole reply, reward 1 when the reply's answer is the gold label and 0 otherwise (a reply with no readable
answer included), and the gold is revealed only in the final step's info, so lesson extraction sees the
outcome while the agent's prompt never contains it. Its spec family is "math": for the agent that family
means a freely written reply that is the action as a whole, which is exactly this (see agent_runtime/episode/prompt.py);
a config gives these environments its own `agent.system_prompt`, since the family's default asks for a
boxed math answer (which the grader accepts too).

`chosen_label(reply, labels)` reads the answer the reply states last, among `<answer>..</answer>` tags (the
OPCD paper's format, LMOps' graders), `\\boxed{..}` and "answer is ..." / "Answer: ...", and failing those a
reply that is nothing but a label ("B", "(B).", "yes"). Inside such a span, a lettered option counts when it
stands alone in capitals ("B", "B. Aspirin", "Option B") or in parentheses ("(b)"), so that the article "a"
in "a stroke" is not read as option A; a word label ("yes"/"no") counts in any case. Model text is data: it
is only matched against these bounded patterns, never executed. With `answer_tag_only` only the tags count,
which is how the paper scored its system-prompt tasks (a reply that answers in another form scores 0 there).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from environments.base import SPLITS, EnvError, EnvSpec
from environments.episodic import DatasetSplits, EpisodicEnv

MAX_REPLY_CHARS = 20_000  # the answer is stated at the end; a longer reply is graded on its tail
_SPANS = (
    re.compile(r"<answer>(.{0,400}?)</answer>", re.IGNORECASE | re.DOTALL),
    re.compile(r"\\boxed\s*\{([^{}]{0,200})\}"),
    re.compile(r"\banswer\s*(?:is|:)\s*((?:(?!\banswer\s*(?:is|:))[^\n]){0,80})", re.IGNORECASE),
)
_LETTER = re.compile(r"(?<![A-Za-z0-9])(\(\s*)?([A-Za-z])(\s*\))?(?![A-Za-z0-9])")
_WORD = re.compile(r"[A-Za-z]+")
_DECORATION = ".:*()[]{}\"'` \t\n"


def _bare(text: str, canonical: dict[str, str]) -> str | None:
    """The label `text` is, once stripped of punctuation and emphasis ("**B**", "(b).", "Yes"), else None."""
    return canonical.get(text.strip(_DECORATION).lower())


def _label_in(fragment: str, canonical: dict[str, str], letters: bool) -> str | None:
    bare = _bare(fragment, canonical)
    if bare is not None:
        return bare
    if letters:
        for match in _LETTER.finditer(fragment):
            letter, parenthesized = match.group(2), bool(match.group(1) and match.group(3))
            if letter.lower() in canonical and (letter.isupper() or parenthesized):
                return canonical[letter.lower()]
        return None
    return next((canonical[w.lower()] for w in _WORD.findall(fragment) if w.lower() in canonical), None)


def chosen_label(reply: str, labels: Sequence[str], *, tag_only: bool = False) -> str | None:
    """The label (one of `labels`, as spelt there) that `reply` states last, or None when it states none.

    `tag_only` reads `<answer>` tags and nothing else, as the OPCD paper's graders do.
    """
    canonical = {label.lower(): label for label in labels}
    letters = all(len(label) == 1 for label in labels)
    reply = reply[-MAX_REPLY_CHARS:]
    patterns = _SPANS[:1] if tag_only else _SPANS
    spans = sorted(((m.start(), m.group(1)) for pattern in patterns for m in pattern.finditer(reply)), reverse=True)
    for _, fragment in spans:
        label = _label_in(fragment, canonical, letters)
        if label is not None:
            return label
    return None if tag_only else _bare(reply, canonical)


class ChoiceEnv(EpisodicEnv):
    """Fixed questions, each answered by one of `labels`, as one-step episodes. The question sets have train and
    eval lists only, so validation is `n_validation` train questions carved out of train, evenly spaced (default: a
    tenth, at most 200; `environments.episodic.carve_validation`), which train then no longer hands out; train and
    eval ids name the rows they named before validation existed."""

    splits = SPLITS

    def __init__(
        self,
        env_id: str,
        description: str,
        questions: dict[str, list[tuple[str, str]]],
        labels: Sequence[str],
        goal: str,
        *,
        source: str,
        answer_tag_only: bool = False,
        n_validation: int | None = None,
        max_steps: int | None = None,
    ) -> None:
        super().__init__(
            EnvSpec(
                id=env_id, version="1", max_steps=1, family="math", description=description, kwargs={"source": source}
            ),
            max_steps=max_steps,
        )
        for split in ("train", "eval"):
            if not questions.get(split):
                raise EnvError(
                    f"{env_id}: the {split} split has no questions (a single file gives every tenth "
                    "row to eval: give at least ten rows, or eval_path= for the eval split)"
                )
        for split, rows in questions.items():
            for question, gold in rows:
                if gold not in labels:
                    raise EnvError(
                        f"{env_id}: gold answer {gold!r} is not one of {', '.join(labels)} (question {question[:60]!r})"
                    )
        self.labels = tuple(labels)
        self.answer_tag_only = answer_tag_only
        self._questions = questions
        self._splits = DatasetSplits(env_id, len(questions["train"]), len(questions["eval"]), n_validation)
        self._goal = goal
        self._gold: str | None = None

    def _tasks(self, split: str) -> Sequence[str]:
        return self._splits.tasks[split]

    def question(self, task_id: str) -> tuple[str, str]:
        """(question, gold label) of a task."""
        rows, row = self._splits.row(task_id)
        return self._questions[rows][row]

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        question, self._gold = self.question(task_id)
        return question, {"goal": self._goal, "won": False, "score": 0.0}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        assert self._gold is not None
        answer = chosen_label(action, self.labels, tag_only=self.answer_tag_only)
        won = answer == self._gold
        info = {"won": won, "score": float(won), "gold": self._gold, "answer": answer}
        return ("Correct." if won else "Incorrect."), float(won), True, info

    def expert_actions(self) -> list[str]:
        """A reply that answers the current question correctly."""
        if self._gold is None:
            raise RuntimeError(f"{self.spec.id}: call reset() before expert_actions()")
        return [f"<answer>{self._gold}</answer>"]
