"""The conditions an OPCD cycle's evaluation plays, in one table for every reader (the terminal's learning table,
the dashboard's cycle matrix): the key each evaluation row stores in `metrics.condition`, the order they are shown
in, and the label, where `{parent}` is the policy the cycle started from and `{split}` the fold the promotion's
decision games were drawn from. `REFERENCE` pairs each condition with the one it is compared against."""

from __future__ import annotations

CONDITIONS = (
    ("random", "random admissible action"),
    ("teacher_without_lessons", "{parent}, no lessons"),
    ("teacher_with_lessons", "{parent} + lessons in context"),
    ("student_without_lessons", "consolidated adapter, no lessons"),
    ("student_with_lessons", "consolidated adapter + lessons"),
    ("teacher_retention", "retention: {parent}"),
    ("student_retention", "retention: consolidated adapter"),
    ("validation_parent", "decision ({split} games): {parent}"),
    ("validation_student", "decision ({split} games): adapter"),
)
REFERENCE = {
    "teacher_with_lessons": "teacher_without_lessons",
    "student_without_lessons": "teacher_without_lessons",
    "student_with_lessons": "teacher_with_lessons",
    "student_retention": "teacher_retention",
    "validation_student": "validation_parent",
}


def condition_labels(parent: str = "base policy", split: str = "validation") -> dict[str, str]:
    """Each known condition's label, in the order they are shown."""
    return {key: label.format(parent=parent, split=split) for key, label in CONDITIONS}
