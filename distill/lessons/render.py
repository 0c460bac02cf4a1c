"""How a stored episode and a pool's lessons are shown to the extractor (plain text, cleaned, capped).

What: `render_trajectory(episode, max_step_chars=, max_chars=)` (task, turns, final outcome and
feedback), `describe_outcome(episode)` (one line: won / lost / not finished / error),
`render_current(lessons)` (the pool's lessons as `- EXPERIENCE ITEM: [#id] text`; each screened again with
`distill.lessons.safety.prompt_lessons`, and one that fails is left out of the extractor's prompt).

Why a module of its own: both the single-trajectory prompt and the contrastive (won vs lost) prompt in
`distill.lessons.extractor` render episodes the same way. Environment text is untrusted, so every piece is
cleaned of chat-template control tokens before it is shown, and long texts keep their head and tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from distill.lessons.safety import prompt_lessons, strip_control

if TYPE_CHECKING:
    from memory import EpisodeInfo, LessonInfo

ITEM_PREFIX = "- EXPERIENCE ITEM:"


def _clip(text: str, limit: int) -> str:
    """At most `limit` characters, keeping the head and the tail (a math answer comes last)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    tail = (limit - 5) // 3
    return text[: limit - 5 - tail].rstrip() + " ... " + text[len(text) - tail :].lstrip()


def _clean(text: str | None, limit: int) -> str:
    return _clip(strip_control(text or ""), limit)


def describe_outcome(episode: EpisodeInfo) -> str:
    """One line: how the episode ended, in the terms the extractor should learn from."""
    verdict = {
        "won": "WON (the goal was reached)",
        "lost": "LOST (the episode ended without reaching the goal)",
        "truncated": "NOT FINISHED (the turn limit was reached before the goal)",
        "error": "FAILED WITH AN ERROR",
    }.get(episode.outcome, episode.outcome.upper())
    line = f"{verdict} after {episode.num_steps} turn(s), total reward {episode.total_return:g}."
    if episode.error:
        line += f" Error: {_clean(episode.error, 300)}"
    return line


def render_trajectory(episode: EpisodeInfo, *, max_step_chars: int = 600, max_chars: int = 6000) -> str:
    """The episode as the extractor reads it: task, turns, final outcome and feedback.

    Each turn shows the observation, the model's response, the parsed action and the reward. If the
    whole exceeds `max_chars`, middle turns are elided (the start and the end carry the most signal).
    """
    head = [f"Environment: {episode.env_id}", f"Task: {_clean(episode.goal or episode.task_id, 500)}"]
    turns = []
    for step in episode.steps:
        action = step.action if step.action is not None else "(no valid action could be read)"
        turns.append(
            f"Turn {step.index + 1}\n"
            f"Observation: {_clean(step.observation, max_step_chars)}\n"
            f"Your response: {_clean(step.response, max_step_chars)}\n"
            f"Action: {_clean(action, 200)} (reward {step.reward:g})"
        )
    feedback = episode.metadata.get("final_observation") or episode.metadata.get("feedback")
    tail = [f"Final outcome: {describe_outcome(episode)}"]
    if feedback:
        tail.append(f"Final feedback from the environment: {_clean(str(feedback), max_step_chars)}")
    budget = max_chars - sum(len(x) + 1 for x in head + tail)
    kept = list(turns)
    while kept and sum(len(t) + 2 for t in kept) > budget and len(kept) > 2:
        del kept[len(kept) // 2]
    if len(kept) < len(turns):
        middle = len(kept) // 2
        kept.insert(middle, f"[... {len(turns) - len(kept)} turn(s) omitted ...]")
    body = "\n\n".join(kept) if kept else "(no turns were played)"
    return "\n".join(head) + "\n\n" + _clip(body, max(budget, 200)) + "\n\n" + "\n".join(tail)


def render_current(current: Sequence[LessonInfo | str]) -> str:
    """The pool's lessons as the extractor sees them: `[#id] text`, or a note that there are none."""
    if not current:
        return "No experience yet."
    lines = []
    for lesson in current:
        text = lesson if isinstance(lesson, str) else lesson.text
        safe = prompt_lessons([text])  # a stored lesson that fails the screen never reaches a prompt
        if not safe:
            continue
        lines.append(
            f"{ITEM_PREFIX} {safe[0]}" if isinstance(lesson, str) else f"{ITEM_PREFIX} [#{lesson.id}] {safe[0]}"
        )
    return "\n".join(lines) if lines else "No experience yet."
