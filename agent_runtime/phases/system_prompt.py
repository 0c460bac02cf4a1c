"""System-prompt distillation's inputs: the fixed context (`opcd.context`) and the prompts it is distilled over.

The paper's second application (arXiv 2602.12275, the medical and safety set-ups; LMOps `trainer.
train_system_prompt`) distils one optimised system prompt into the weights: the teacher reads the prompt with
the system prompt, the student without it, on the task's prompts. LMOps inserts it as a system message ahead
of the prompt's messages; our teacher view (`distill.opcd.with_context`) is the same where a prompt has no
system message, and appends it to the existing one where it has (chat templates take one system message).

The context is read when a cycle starts (so the cycle row records what was distilled, its text and SHA-256,
whatever the file holds later). The prompts are the run's recent per-turn prompts by default, or a JSONL file:
one prompt per line, `{"messages": [{"role": ..., "content": ...}, ...]}`, or `{"prompt": ...}` /
`{"content": ...}` holding a string (one user message) or a message list (the dataset exports of LMOps'
system-prompt tasks carry their chat under `prompt`). A line that is none of these is an error naming it. With
the run's held-out tasks given (`agent_runtime.evaluation.heldout`), a line whose first user turn is or holds a held-out
task's opening is a `PromptFileLeakError` naming the line: a cycle never trains on what evaluates it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from agent_runtime.config import ConfigError, SystemPromptConfig
from agent_runtime.evaluation.heldout import EvalLeakError, HeldOut

PROMPT_KEYS = ("messages", "prompt", "content")
ROLES = ("system", "user", "assistant")


class PromptFileLeakError(EvalLeakError, ConfigError):
    """A line of a prompt file holds a held-out evaluation task: a leak, and a mistake in a file the user gave."""


@dataclass(frozen=True)
class SystemPrompt:
    """The context of a system-prompt cycle, as the cycle row records it."""

    text: str
    sha256: str
    source: str  # the file it was read from, or "opcd.context.text"

    def record(self) -> dict[str, str]:
        return {"sha256": self.sha256, "source": self.source, "text": self.text}


def load_context(context_config: SystemPromptConfig) -> SystemPrompt:
    """The system prompt of `opcd.context`, read now; ConfigError when its file is missing or empty."""
    if context_config.text is not None:
        text, source = context_config.text, "opcd.context.text"
    else:
        path = Path(context_config.file).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"opcd.context.file: {path} does not exist; give a UTF-8 text file holding the system "
                "prompt to distil (or opcd.context.text)"
            )
        text, source = path.read_text(encoding="utf-8"), str(path)
    text = text.strip()
    if not text:
        raise ConfigError(f"opcd.context: {source} is empty; give the system prompt to distil")
    return SystemPrompt(text, hashlib.sha256(text.encode("utf-8")).hexdigest(), source)


def _chat(value, where: str) -> list[dict]:
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{where}: the prompt is empty")
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        chat = []
        for m in value:
            if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise ConfigError(
                    f"{where}: every message needs a role ({', '.join(ROLES)}) and a string content, got {m!r}"
                )
            chat.append({"role": m["role"], "content": m["content"]})
        if chat[-1]["role"] == "assistant":
            raise ConfigError(f"{where}: the prompt ends with an assistant message; the student writes that turn")
        return chat
    raise ConfigError(f"{where}: expected a string or a list of {{role, content}} messages, got {type(value).__name__}")


def load_prompts(path: str | Path, *, held: HeldOut | None = None) -> list[list[dict]]:
    """The chats of a JSONL prompt file (see the module docstring); ConfigError naming the line that is wrong, and
    with `held`, PromptFileLeakError naming a line whose first user turn holds a held-out task's opening."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"prompt file {path} does not exist; give a JSONL file with one prompt per line "
            f"(keys: {', '.join(PROMPT_KEYS)})"
        )
    chats = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc})") from None
        key = next((k for k in PROMPT_KEYS if isinstance(row, dict) and k in row), None)
        if key is None:
            raise ConfigError(f"{where}: no prompt; each line is a JSON object with one of: {', '.join(PROMPT_KEYS)}")
        chat = _chat(row[key], where)
        first = next((m["content"] for m in chat if m["role"] == "user"), None)
        task = held.task_in(first) if held is not None and first is not None else None
        if task is not None:
            raise PromptFileLeakError(
                f"{where}: the first user turn holds the opening of held-out evaluation task "
                f"{task[1]!r} of {task[0]}; the cycle is evaluated on it, so it may not train "
                "on it: leave that line out of the prompt file"
            )
        chats.append(chat)
    if not chats:
        raise ConfigError(f"prompt file {path} holds no prompts")
    return chats
