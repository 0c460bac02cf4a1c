"""A scripted policy backend, shipped in the package for tests, demos and smoke runs.

It reads the last user message the agent wrote and answers without a model, hundreds of episodes a minute:

- `random-admissible` (default): a command game's prompt lists "Admissible actions: a | b | c"; the backend
  picks one at random. A TextArena prompt lists bracketed moves; it picks one. A math prompt gets `fixed_answer`
  ("The answer is 42" unless set). A seeded call (`SamplingParams.seeds` or `seed`) picks each row's from that
  row's seed alone, so a run replays; unseeded, from the backend's own generator (seeded with `seed`).
- `fixed`: always `fixed_answer`.
- `sequence`: replies from the `replies` list in turn (cycling), for tests that need exact control (a count kept
  across calls: such a run does not replay).

With `follow_lessons`, a lesson in the system prompt of the form "Always reply: X" makes the policy reply X:
a policy for which a lesson is known to help or hurt, to test the lesson gate. Two rules that name different
replies contradict each other, and the policy follows neither (as a model given contradictory orders might), so a
test can see lessons that each help alone hurt together. It also follows the lessons
`distill.lessons.induce` writes, when the prompt lists admissible actions: "When you can X, X." (or "When you
see Y, X.") picks an admissible action that is X or starts with the verb X, and "X never helps." leaves X (or
X's verb) out of the random pick -- so a test can see a right induced lesson raise success and a wrong one lower it.

In every mode, a lesson-extraction prompt (one that asks for "EXPERIENCE ITEM" lines) is answered with
`lesson_reply`, so the EXTRACT phase can be exercised without a model.

Token counts are whitespace words, which is all a smoke test needs.
"""

from __future__ import annotations

import math
import random
import re
import time

from agent_runtime.llm.base import BackendStats, Chat, Completion, SamplingParams, closest_action, row_seeds
from agent_runtime.llm.modes import ADMISSIBLE_PREFIX, ADMISSIBLE_SEPARATOR

_BRACKETED = re.compile(r"\[([a-z]+)\]")
_ALWAYS_REPLY = re.compile(r"Always reply: (.+)$", re.MULTILINE)
_WHEN_YOU_CAN = re.compile(r"When you can ([a-z][a-z ]*?), \1\b", re.IGNORECASE)
_WHEN_YOU_SEE = re.compile(r"When you see [^,.\n]{1,80}, ([a-z][a-z ]*?)\.", re.IGNORECASE)
_NEVER_HELPS = re.compile(r"(?:^|[.:>-]\s*)([A-Za-z][a-z ]*?) never helps\.", re.MULTILINE)


def _matches(action: str, key: str) -> bool:
    return action == key or action.startswith(key + " ")


class ScriptedBackend:
    name = "scripted"
    row_seeded = True

    def __init__(
        self,
        mode: str = "random-admissible",
        fixed_answer: str = "The answer is 42.",
        replies: list[str] | None = None,
        seed: int = 0,
        context_window: int = 8192,
        lesson_reply: str = "- EXPERIENCE ITEM: Take the coin as soon as you see it.",
        follow_lessons: bool = False,
    ):
        modes = ("random-admissible", "fixed", "sequence")
        if mode not in modes:
            raise ValueError(f"unknown scripted mode {mode!r}; accepted: {', '.join(modes)}")
        if mode == "sequence" and not replies:
            raise ValueError("scripted mode 'sequence' needs a non-empty `replies` list")
        self.mode = mode
        self.fixed_answer = fixed_answer
        self.replies = list(replies or [])
        self.lesson_reply = lesson_reply
        self.follow_lessons = follow_lessons
        self._next_reply = 0
        self._rng = random.Random(seed)
        self._context_window = context_window
        self.stats = BackendStats()

    @property
    def context_window(self) -> int:
        return self._context_window

    def count_tokens(self, chat: Chat) -> int:
        return sum(len(m["content"].split()) + 2 for m in chat)

    def _reply(self, chat: Chat, rng: random.Random) -> str:
        last = next((m["content"] for m in reversed(chat) if m["role"] == "user"), "")
        if "EXPERIENCE ITEM" in last:
            return self.lesson_reply
        if self.follow_lessons:
            system = next((m["content"] for m in chat if m["role"] == "system"), "")
            rules = {rule.strip() for rule in _ALWAYS_REPLY.findall(system)}
            if len(rules) == 1:
                return rules.pop()
        if self.mode == "fixed":
            return self.fixed_answer
        if self.mode == "sequence":
            reply = self.replies[self._next_reply % len(self.replies)]
            self._next_reply += 1
            return reply
        for line in reversed(last.splitlines()):
            if line.startswith(ADMISSIBLE_PREFIX):
                options = [a for a in line[len(ADMISSIBLE_PREFIX) :].strip().split(ADMISSIBLE_SEPARATOR) if a]
                if options and self.follow_lessons:
                    options = self._follow(next((m["content"] for m in chat if m["role"] == "system"), ""), options)
                if options:
                    return rng.choice(options)
        moves = _BRACKETED.findall(last)
        if moves:
            return f"[{rng.choice(sorted(set(moves)))}]"
        return self.fixed_answer

    @staticmethod
    def _follow(system: str, options: list[str]) -> list[str]:
        """The admissible actions an induced lesson leaves: the preferred ones if any is offered, else all but
        the ones that never help (all of them if a lesson would leave none)."""
        for key in _WHEN_YOU_CAN.findall(system) + _WHEN_YOU_SEE.findall(system):
            preferred = [a for a in options if _matches(a, key.lower())]
            if preferred:
                return preferred
        banned = [key.lower() for key in _NEVER_HELPS.findall(system)]
        kept = [a for a in options if not any(_matches(a, b) for b in banned)]
        return kept or options

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Completion]:
        start = time.perf_counter()
        out = []
        seeds = row_seeds(params, len(prompts))
        for row, chat in enumerate(prompts):
            text = self._reply(chat, random.Random(seeds[row]) if seeds else self._rng)
            words = text.split()
            out.append(
                Completion(
                    text=text,
                    token_ids=list(range(len(words))),
                    prompt_tokens=self.count_tokens(chat),
                    logprobs=[0.0] * len(words) if params.logprobs else None,
                    prompt_text="\n".join(f"<{m['role']}> {m['content']}" for m in chat),
                )
            )
        self.stats.record(out, time.perf_counter() - start)
        return out

    def choose(self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams) -> list[Completion]:
        """Choice mode: the scripted reply mapped to the closest action of the set; the recorded distribution
        is uniform (a script has none of its own)."""
        out = self.generate(prompts, params)
        for completion, options in zip(out, choices):
            completion.text = closest_action(completion.text, options)
            completion.choice_logprobs = [-math.log(len(options))] * len(options)
            completion.logprobs = [-math.log(len(options))]
        return out

    def close(self) -> None:
        pass
