"""How an episode asks a backend to act, which both sides must agree on: in `choice` mode the backend picks one
of the admissible actions (a `ChoiceBackend`), shown in the prompt as `Admissible actions: a | b` (the scripted
backend reads the list back from there); in `free` mode it writes the action. `auto` chooses wherever a game has
actions to choose among, and answers math in free text."""

from __future__ import annotations

ADMISSIBLE_PREFIX = "Admissible actions:"  # how the action list is shown in a prompt
ADMISSIBLE_SEPARATOR = " | "
ACTION_MODES = ("auto", "choice", "free")


def resolve_action_mode(mode: str, family: str) -> str:
    """`choice` or `free` for an environment family: `auto` chooses among actions wherever a game has them."""
    if mode not in ACTION_MODES:
        raise ValueError(f"unknown action_mode {mode!r}; accepted: {', '.join(ACTION_MODES)}")
    if mode == "auto":
        return "free" if family == "math" else "choice"
    return mode
