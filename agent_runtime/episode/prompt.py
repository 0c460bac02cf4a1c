"""The agent: how a prompt is assembled from an episode's state, and how an action is read from a reply.

A prompt is a chat: a system message (the instructions for the environment's family, then the active
lessons as `distill.lessons.curate.render_lessons` renders them, the very text their budget is counted on), the
recent turns of the episode as user/assistant pairs, and the current observation with the admissible actions when
the game knows them. It is fitted to the model's context window by dropping the
oldest turns first; the lessons and the current observation are never dropped.

Past turns are shown exactly as they were sent, action list included (`history_shows_admissible`, the
default): the transcript only grows at its end, so the transformers backend's per-slot KV cache (and vLLM's
prefix caching on GPU) reuses all of it and a turn prefills only the new observation. Switched off, past
observations lose their lists (shorter prompts: an ALFWorld list is 30-50 actions), and every turn
re-prefills from the previous observation on. See bench/RESULTS.md for what each costs.

How the agent acts (`action_mode`): in `choice` mode (the default wherever the game lists its admissible
actions, and for the arena games' four moves) the reply is exactly one action of the set, drawn from the
model's own distribution restricted to the set (`modelkit.choice`); in `free` mode (the default for math)
the model writes a reply and the action is parsed from it. A small model that answers a game with prose still
ranks the admissible actions sensibly, and that ranking is what its lessons move.

Free replies are parsed per environment family:

- `text` (TextWorld, ALFWorld): the first non-empty line, with chatter such as "> " or "Action:" removed;
  matched case-insensitively against the admissible actions when the game lists them. A line the game would
  read as several objects or commands ("take all.", "take X and Y", "take X. take Y";
  `environments.interpreter.multi_command`) is no action unless it is exactly an admissible one.
- `arena` (TextArena): the last bracketed move, `[up]`/`[down]`/`[left]`/`[right]` or `[w]`/`[a]`/`[s]`/`[d]`.
- `math`: the whole reply (the grader finds the last stated answer in it).

A reply with nothing parseable gives `None`, which the runner records as an invalid action.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from agent_runtime.llm.base import Chat
from agent_runtime.llm.modes import ADMISSIBLE_PREFIX, ADMISSIBLE_SEPARATOR
from distill.lessons.curate import render_lessons
from environments.interpreter import multi_command

ARENA_MOVES = ("[up]", "[down]", "[left]", "[right]")

SYSTEM_PROMPTS = {
    "text": (
        "You are playing a text adventure game. Read the observation and reply with exactly one command "
        "for the game, on one line, with no explanation."
    ),
    "arena": (
        "You are playing a grid puzzle game. Think briefly, then give your move as the last thing in your "
        "reply, in brackets: [up], [down], [left] or [right]."
    ),
    "math": ("Solve the math problem. Reason step by step, then give the final answer as \\boxed{ANSWER}."),
}

CHOICE_SYSTEM_PROMPTS = {  # in choice mode the reply is the move itself: no reasoning to ask for
    "arena": "You are playing a grid puzzle game. Reply with exactly one move: [up], [down], [left] or [right].",
}

_CHATTER = re.compile(r"^\s*(?:>+|[-*]\s|\d+[.)]\s|(?:action|command|next action|answer)\s*:)\s*", re.IGNORECASE)
_ARENA_MOVE = re.compile(r"\[\s*(up|down|left|right|w|a|s|d)\s*\]", re.IGNORECASE)
_WASD = {"w": "up", "a": "left", "s": "down", "d": "right"}


@dataclass
class Turn:
    observation: str
    response: str
    admissible: list[str] | None = None  # the actions listed with the observation when it was current


@dataclass
class PromptBuilder:
    """Builds the chat for one decision. `count_tokens` is the backend's, so the fit is in real tokens."""

    family: str
    count_tokens: Callable[[Chat], int]
    context_window: int
    system_prompt: str | None = None
    show_admissible_actions: bool = True
    history_shows_admissible: bool = True
    max_history_turns: int = 8
    reserve_tokens: int = 64  # room for the reply
    lessons: list[str] = field(default_factory=list)
    action_mode: str = "free"  # resolved: "choice" or "free"
    context: str | None = None  # a distilled system prompt shown in context (the OPCD teacher's view of it)

    def choices(self, admissible: list[str] | None) -> list[str] | None:
        """The set a choice-mode decision picks from (the game's admissible actions, or the arena's moves);
        None when this decision is written freely."""
        if self.action_mode != "choice" or self.family == "math":
            return None
        if admissible:
            return list(admissible)
        return list(ARENA_MOVES) if self.family == "arena" else None

    def system_message(self, lessons: list[str] | None = None) -> str:
        default = SYSTEM_PROMPTS.get(self.family, SYSTEM_PROMPTS["text"])
        if self.action_mode == "choice":
            default = CHOICE_SYSTEM_PROMPTS.get(self.family, default)
        text = self.system_prompt or default
        block = render_lessons(self.lessons if lessons is None else lessons)
        if block:
            text += "\n\n" + block
        return text

    def current_message(self, observation: str, admissible: list[str] | None) -> str:
        text = observation.strip()
        if self.show_admissible_actions and admissible:
            text += f"\n\n{ADMISSIBLE_PREFIX} {ADMISSIBLE_SEPARATOR.join(admissible)}"
        return text

    def build(
        self,
        history: list[Turn],
        observation: str,
        admissible: list[str] | None,
        lessons: list[str] | None = None,
        examples: list[str] | None = None,
    ) -> Chat:
        """The chat for one decision; `lessons` overrides the builder's own for this episode, `examples` are
        retrieved past episodes shown after the lessons."""
        system_text = self.system_message(lessons)
        if examples:
            system_text += "\n\nExamples of past successful episodes:\n" + "\n".join(f"- {e}" for e in examples)
        if self.context:  # last, as distill.opcd.with_context appends it
            system_text += "\n\n" + self.context
        system = {"role": "system", "content": system_text}
        current = {"role": "user", "content": self.current_message(observation, admissible)}
        turns = history[-self.max_history_turns :] if self.max_history_turns else []
        while True:
            chat = [system]
            for turn in turns:
                shown = (
                    self.current_message(turn.observation, turn.admissible)
                    if self.history_shows_admissible
                    else turn.observation.strip()
                )
                chat.append({"role": "user", "content": shown})
                chat.append({"role": "assistant", "content": turn.response.strip()})
            chat.append(current)
            if not turns or self.count_tokens(chat) + self.reserve_tokens <= self.context_window:
                return chat
            turns = turns[1:]


def parse_action(family: str, reply: str, admissible: list[str] | None = None) -> str | None:
    """The action in `reply` for an environment family, or None when nothing can be parsed."""
    if family == "math":
        return reply.strip() or None
    if family == "arena":
        moves = _ARENA_MOVE.findall(reply)
        if not moves:
            return None
        move = moves[-1].lower()
        return f"[{_WASD.get(move, move)}]"
    for line in reply.splitlines():
        line = _CHATTER.sub("", line).strip().strip("`\"'").rstrip(".!").strip()
        if not line:
            continue
        lowered = {a.lower(): a for a in admissible or []}
        if line.lower() in lowered:
            return lowered[line.lower()]
        return None if multi_command(line) is not None else line.lower()
    return None
