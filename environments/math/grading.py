"""Answer grading for math environments: `is_correct(response, gold)`, built on math-verify.

A response is graded on its *last stated answer*: the last of ``\\boxed{..}``, ``#### ..``,
``Answer: ..``, "The final answer is ..", "the answer is .."; without any of those, its last line.
That answer and the gold are both parsed as LaTeX by math-verify (latex2sympy, an ANTLR grammar),
which compares numbers, fractions against decimals, equivalent expressions, tuples, sets, intervals
and equations like ``x = 5`` against ``5``. We never hand model text to Python's `eval` (so we use
math-verify's LaTeX extraction only, not its sympy `parse_expr` path), and inputs are length-capped.

math-verify guards each parse/compare with a SIGALRM timeout, which Python only allows on the main
thread; rollout workers grade from threads, so off the main thread we switch its timeout off (it
raises otherwise) and rely on the length cap to keep sympy fast.
"""

from __future__ import annotations

import re
import threading

MAX_ANSWER_CHARS = 400
TIMEOUT_SECONDS = 5

_MARKERS = [
    re.compile(r"####\s*(?P<a>[^\n]+)"),
    re.compile(r"(?i)final answer\s*(?:is|:|=)?\s*:?\s*(?P<a>[^\n]+)"),
    re.compile(r"(?i)\banswer\s*(?:is|:|=)\s*:?\s*(?P<a>[^\n]+)"),
]
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER_WITH_WORDS = re.compile(r"^\$?\s*(-?[\d,]*\.?\d+)\s*%?\s*[A-Za-z][A-Za-z\s]*$")


def _boxed_answers(text: str) -> list[tuple[int, str]]:
    found = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append((match.start(), text[start:i]))
                break
    return found


def extract_final_answer(response: str) -> str | None:
    """The last stated answer in `response` (see the module docstring), or None for an empty response."""
    candidates = _boxed_answers(response)
    for pattern in _MARKERS:
        candidates += [(m.start(), m.group("a")) for m in pattern.finditer(response)]
    if candidates:
        position = max(pos for pos, _ in candidates)
        # several markers can start at one place ("final answer is" inside "The final answer is"): shortest wins
        answer = min((a for pos, a in candidates if pos == position), key=len)
        inner = _boxed_answers(answer)  # "Answer: \boxed{3}"
        answer = inner[-1][1] if inner else answer
    else:
        lines = [line for line in response.strip().splitlines() if line.strip()]
        if not lines:
            return None
        answer = lines[-1]
    return _tidy(answer)


def _tidy(answer: str) -> str:
    answer = answer.strip().rstrip(".").strip()
    if len(answer) >= 2 and answer[0] == answer[-1] == "$":
        answer = answer.strip("$").strip()
    answer = answer.replace("\\$", "").replace("\\!", "")
    match = _NUMBER_WITH_WORDS.match(answer)  # "18 dollars", "$18 per hour"
    if match:
        answer = match.group(1)
    elif answer.startswith("$") and re.match(r"^\$\s*-?[\d,.]+$", answer):
        answer = answer[1:].strip()
    return answer


def _parse(latex: str, timeout: int | None) -> list:
    from math_verify import LatexExtractionConfig, parse

    return parse(f"${latex}$", extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
                 parsing_timeout=timeout)


def is_correct(response: str, gold: str) -> bool:
    """True when the last stated answer of `response` equals `gold` mathematically.

    `gold` may be a bare answer ("18", "\\frac{1}{2}", "(1, 2)") or a worked solution ending in
    "#### 18" or a boxed answer. Unparseable answers are simply wrong; this never raises on model text.
    """
    from math_verify import verify

    gold_answer = extract_final_answer(gold) if re.search(r"####|\\boxed|\\fbox", gold) else _tidy(gold)
    answer = extract_final_answer(response)
    if not answer or not gold_answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    timeout = TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    try:
        parsed_gold, parsed_answer = _parse(gold_answer[:MAX_ANSWER_CHARS], timeout), _parse(answer, timeout)
        if not parsed_gold or not parsed_answer:
            return answer.strip() == gold_answer.strip()
        return bool(verify(parsed_gold, parsed_answer, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - math-verify/sympy failures on odd text mean "not a matching answer"
        return False
