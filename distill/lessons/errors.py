"""Typed errors of the lessons package, each with a message that says what to do next."""

from __future__ import annotations


class LessonsError(Exception):
    """Base class of every error `distill.lessons` raises on purpose."""


class UnknownVersionError(LessonsError, KeyError):
    """A lesson-set version that the run does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownLessonError(LessonsError, KeyError):
    """A lesson id that is not (or no longer) in the run's lesson set, or belongs to another run."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class GateInputError(LessonsError, ValueError):
    """The gate was given outcomes it cannot compare (no episodes, or not the same seeds)."""
