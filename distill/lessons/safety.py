"""Safety screening of lesson text: what may enter later prompts (and, through OPCD, the weights).

What: `screen_item(text, max_chars) -> Screened` cleans one extracted item or rejects it with a reason;
`screen_items(items, max_chars) -> (accepted, rejections)` does a batch; `strip_control(text)` removes
chat-template control tokens (used on trajectories before they enter an extraction prompt);
`redact_secrets(text)` masks anything that looks like a credential (used on what we store).

Why these rules: lessons are written by a model that read environment text, and environment text is
untrusted (a poisoned game can print anything). Three threats, three defences:
- Fake turn boundaries: chat-template control tokens (`<|im_start|>`, `[INST]`, `<s>`, ...) and role
  markers ("system:", "assistant:") could let a lesson impersonate another turn. They are stripped,
  and the item is collapsed onto one line (a lesson is a single line of the experience block).
- Instruction hijacking: items that tell the model to ignore or override its instructions, reveal its
  prompt, or switch into an unrestricted persona are rejected outright (rewriting them is guesswork).
- Secret leakage: items that look like API keys, tokens, private keys or passwords are rejected, and the
  rejection record keeps only a redacted preview, so the secret is not copied into the memory either.
Length is capped by cutting at a word boundary (a long item is usually a good item that rambles).
Reasons are short stable strings ("injection: ...", "secret: ...", "empty") so they can be counted.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

# Chat-template control tokens of the common families: ChatML / Qwen / Phi (<|...|>), Llama 2 ([INST],
# <<SYS>>), Llama 3 (<|start_header_id|> is covered by <|...|>), Gemma (<start_of_turn>), BOS/EOS/PAD.
_CONTROL = re.compile(
    r"<\|(?:im_start|start_header_id)\|>\s*(?:system|user|assistant|tool|developer)?\b\s*:?"
    r"|<start_of_turn>\s*(?:user|model|system)?\b\s*:?"
    r"|<\|[^|<>\n]{0,40}\|>"
    r"|\[/?INST\]|<</?SYS>>"
    r"|</?s>|<bos>|<eos>|<pad>|<unk>|<mask>"
    r"|<end_of_turn>"
    r"|</?(?:think|thinking|reasoning)>"
    r"|^\s*#{2,}\s*(?:instruction|response|system|input)\s*:?",
    re.IGNORECASE | re.MULTILINE,
)
_ROLE = re.compile(r"(?<![\w-])(?:system|assistant|user|human|developer)\s*:", re.IGNORECASE)

_INJECTION = [
    (re.compile(p, re.IGNORECASE), why)
    for p, why in [
        (
            (
                r"\b(?:ignore|disregard|forget|override|bypass)\b[\w\s,'-]{0,40}?"
                r"\b(?:instructions?|prompts?|rules|directions|guidelines|directives|constraints|"
                r"guardrails|polic(?:y|ies))\b"
            ),
            "injection: ignore instructions",
        ),
        (
            (
                r"\b(?:reveal|print|repeat|show|output|leak|disclose)\b[\w\s'-]{0,30}?"
                r"\b(?:system|hidden|secret|initial|original)\s+(?:prompt|instructions?|message)"
            ),
            "injection: reveal the prompt",
        ),
        (r"\bnew\s+(?:system\s+)?instructions?\s*:", "injection: new instructions"),
        (r"\byou\s+are\s+now\b|\bfrom\s+now\s+on\s*,?\s+you\b", "injection: persona switch"),
        (
            r"\b(?:jailbreak|jailbroken|developer\s+mode|do\s+anything\s+now|DAN\s+mode)\b",
            "injection: jailbreak",
        ),
        (
            r"\b(?:act|behave|respond)\s+as\s+(?:an?\s+)?(?:unrestricted|unfiltered|uncensored)\b",
            "injection: unrestricted persona",
        ),
        (
            r"\b(?:disable|turn\s+off|remove)\b[\w\s'-]{0,20}?\b(?:safety|filters?|moderation)\b",
            "injection: disable safety",
        ),
    ]
]

_CREDENTIAL = r"(?:password|passwd|pwd|passphrase|secret|api[_ -]?key|access[_ -]?key|auth[_ -]?token|token)\b"
_SECRETS = [
    (re.compile(p), why)
    for p, why in [
        (r"-----BEGIN [A-Z ]*PRIVATE KEY-----", "secret: private key"),
        (r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}", "secret: API key"),
        (r"\bAKIA[0-9A-Z]{16}\b", "secret: AWS access key"),
        (r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{20,}", "secret: GitHub token"),
        (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", "secret: Slack token"),
        (r"\bAIza[0-9A-Za-z_-]{30,}", "secret: Google API key"),
        (r"\bhf_[A-Za-z0-9]{30,}", "secret: Hugging Face token"),
        (r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", "secret: JWT"),
        (r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{16,}", "secret: bearer token"),
        (
            rf"(?i)\b{_CREDENTIAL}\s*[=:]\s*['\"]?[^\s'\"]{{6,}}",
            "secret: credential assignment",
        ),
        (
            # "the password is X" only when X looks machine-made (a digit or symbol): game text says
            # "the secret is behind the painting" and that is a fine lesson.
            rf"(?i)\b{_CREDENTIAL}\s+is\s+['\"]?(?=[^\s'\"]*[\d_!@#$%^&*+/=])[^\s'\"]{{6,}}",
            "secret: credential assignment",
        ),
    ]
]
_TOKENISH = re.compile(r"[A-Za-z0-9+/_=-]{32,}")
_SPACES = re.compile(r"\s+")
_MARKDOWN_EDGE = re.compile(r"^[\s*_`\"'>:;,.]+|[\s*_`\"']+$")


@dataclass(frozen=True)
class Rejection:
    """An item that was not accepted: a redacted preview of it and why."""

    text: str
    reason: str


@dataclass(frozen=True)
class Screened:
    """The outcome of screening one item: `text` when accepted (cleaned), else `reason`."""

    text: str | None
    reason: str | None = None
    truncated: bool = False

    @property
    def accepted(self) -> bool:
        return self.text is not None


def strip_control(text: str) -> str:
    """`text` without chat-template control tokens and role markers (newlines kept)."""
    return _ROLE.sub("", _CONTROL.sub(" ", text))


def _entropy(s: str) -> float:
    counts = Counter(s)
    return -sum(c / len(s) * math.log2(c / len(s)) for c in counts.values())


def _high_entropy_token(text: str) -> bool:
    """A long run of key-alphabet characters mixing letters and digits with high entropy."""
    for match in _TOKENISH.finditer(text):
        run = match.group()
        if any(c.isdigit() for c in run) and any(c.isalpha() for c in run) and _entropy(run) > 4.0:
            return True
    return False


def find_secret(text: str) -> str | None:
    """The reason `text` looks like it holds a secret, or None."""
    for pattern, why in _SECRETS:
        if pattern.search(text):
            return why
    if _high_entropy_token(text):
        return "secret: high-entropy token"
    return None


def redact_secrets(text: str) -> str:
    """`text` with every secret-looking span replaced by "[REDACTED]"."""
    for pattern, _ in _SECRETS:
        text = pattern.sub("[REDACTED]", text)

    def mask(match: re.Match[str]) -> str:
        run = match.group()
        mixed = any(c.isdigit() for c in run) and any(c.isalpha() for c in run)
        return "[REDACTED]" if mixed and _entropy(run) > 4.0 else run

    return _TOKENISH.sub(mask, text)


def find_injection(text: str) -> str | None:
    """The reason `text` reads as a prompt-injection attempt, or None."""
    for pattern, why in _INJECTION:
        if pattern.search(text):
            return why
    return None


def _cap(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    cut = text[:max_chars]
    space = cut.rfind(" ")
    if space >= max_chars // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-"), True


MIN_ITEM_WORDS = 3  # "xxx", "experiment": a small model's filler, not a transferable rule


def screen_item(text: str, max_chars: int = 300) -> Screened:
    """Clean one item (control tokens, role markers, newlines, markdown edges, length) or reject it.

    The checks for injections and secrets run on the text both before and after cleaning, so hiding a
    phrase behind control tokens ("ig<|x|>nore ...") does not help.
    """
    assert max_chars > 0, f"max_chars must be positive, got {max_chars}"
    joined = _ROLE.sub("", _CONTROL.sub("", text))
    for candidate in (text, joined, strip_control(text)):
        reason = find_secret(candidate) or find_injection(_SPACES.sub(" ", candidate))
        if reason:
            return Screened(None, reason)
    cleaned = _SPACES.sub(" ", strip_control(text).replace("**", "").replace("__", "")).strip()
    cleaned = _MARKDOWN_EDGE.sub("", cleaned).strip()
    reason = find_injection(cleaned)
    if reason:
        return Screened(None, reason)
    if not cleaned or not any(c.isalnum() for c in cleaned):
        return Screened(None, "empty")
    is_delete = re.match(r"\s*DELETE\s*#\d+", cleaned, re.IGNORECASE)
    if not is_delete and len(re.findall(r"[^\W\d_]{2,}", cleaned)) < MIN_ITEM_WORDS:
        return Screened(None, f"too short to be a rule (fewer than {MIN_ITEM_WORDS} words)")
    cleaned, truncated = _cap(cleaned, max_chars)
    return Screened(cleaned, None, truncated)


def screen_items(items: Iterable[str], max_chars: int = 300) -> tuple[list[str], list[Rejection]]:
    """Screen a batch: (accepted cleaned items in order, rejections with redacted previews)."""
    accepted: list[str] = []
    rejected: list[Rejection] = []
    for item in items:
        verdict = screen_item(item, max_chars)
        if verdict.text is not None:
            accepted.append(verdict.text)
        else:
            preview = redact_secrets(_SPACES.sub(" ", item).strip())[:200]
            rejected.append(Rejection(preview, verdict.reason or "rejected"))
    return accepted, rejected
