"""Answer grading for math environments: `is_correct(response, gold)`, built on math-verify.

A response is graded on its *last stated answer*: the last of ``\\boxed{..}``, ``#### ..``,
``Answer: ..``, "The final answer is ..", "the answer is .."; without any of those, its last line.
That answer and the gold are both parsed as LaTeX by math-verify (latex2sympy, an ANTLR grammar),
which compares numbers, fractions against decimals, equivalent expressions, tuples, sets, intervals
and equations like ``x = 5`` against ``5``. We never hand model text to Python's `eval` (so we use
math-verify's LaTeX extraction only, not its sympy `parse_expr` path), and inputs are length-capped.

Grading time is bounded in any thread, in two steps:
1. Before anything is parsed, `environments.math.bounds.oversized` estimates from the LaTeX how big a
   number the answer would make sympy compute (`9^{9^{9}}`, `1000000!`, `\\binom{10^7}{5000000}`,
   products over a million terms) and such an answer is wrong at once (unless it is the gold's very
   text). These computations run inside single C calls that hold the GIL for minutes and that no
   signal interrupts; a grading thread could not even be abandoned.
2. What passes is parsed and compared in a grading process of our own (one per runtime process,
   started on first use, shared by its threads under a lock). There, on its main thread,
   math-verify's SIGALRM timeouts work as designed (`TIMEOUT_SECONDS` per parse or compare); and if a
   whole grade takes longer than `DEADLINE_SECONDS`, the process is killed (the answer is wrong) and a
   fresh one is started at once for the next grade. Only the two answer strings and a boolean cross
   the process boundary, as JSON.
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from environments.base import EnvError
from environments.math.bounds import oversized

MAX_ANSWER_CHARS = 400
TIMEOUT_SECONDS = 5  # per math-verify parse or compare, inside the grading process
DEADLINE_SECONDS = 6.0  # per grade, wall clock: beyond it the grading process is killed
STARTUP_SECONDS = 120.0  # importing sympy and math-verify in a new grading process

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

    return parse(
        f"${latex}$", extraction_config=[LatexExtractionConfig(boxed_match_priority=0)], parsing_timeout=timeout
    )


def _equal(gold_answer: str, answer: str, timeout: int | None) -> bool:
    """math-verify's verdict on two extracted answers (run inside the grading process)."""
    from math_verify import verify

    try:
        parsed_gold, parsed_answer = _parse(gold_answer[:MAX_ANSWER_CHARS], timeout), _parse(answer, timeout)
        if not parsed_gold or not parsed_answer:
            return answer.strip() == gold_answer.strip()
        return bool(verify(parsed_gold, parsed_answer, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - math-verify/sympy failures on odd text mean "not a matching answer"
        return False


class _GradingProcess:
    """The child process that runs `_equal`, shared by the threads of this process (see the module doc)."""

    _lock = threading.Lock()
    _proc: subprocess.Popen | None = None
    _conn: multiprocessing.connection.Connection | None = None
    _owner: int | None = None
    _log: Any = None
    _ready = False

    @classmethod
    def _start(cls) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        package_parent = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        cls._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process it logs
        serve = "import sys; from environments.math.grading import _serve; _serve(int(sys.argv[1]))"
        cls._proc = subprocess.Popen(
            [sys.executable, "-c", serve, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=cls._log,
        )
        theirs.close()
        cls._conn = multiprocessing.connection.Connection(ours.detach())
        cls._owner, cls._ready = os.getpid(), False

    @classmethod
    def _stop(cls) -> None:
        if cls._conn is not None:
            cls._conn.close()
        if cls._proc is not None and cls._owner == os.getpid():
            cls._proc.kill()
            cls._proc.wait()
        if cls._log is not None:
            cls._log.close()
        cls._proc = cls._conn = cls._owner = cls._log = None

    @classmethod
    def _await_ready(cls) -> None:
        """Wait for the new process's imports; a process that cannot start is an error, not a wrong answer."""
        try:
            if cls._conn.poll(STARTUP_SECONDS) and cls._conn.recv_bytes() == b"ready":
                cls._ready = True
                return
            why = f"did not start within {STARTUP_SECONDS:.0f} s"
        except (EOFError, OSError):
            why = f"exited at start (code {cls._proc.wait()})"
        cls._log.seek(0)
        tail = cls._log.read().decode(errors="replace").strip()[-800:]
        cls._stop()
        raise EnvError(f"math grading: the grading process {why}" + (f": {tail}" if tail else ""))

    @classmethod
    def equal(cls, gold_answer: str, answer: str) -> bool:
        with cls._lock:
            if cls._proc is None or cls._owner != os.getpid() or cls._proc.poll() is not None:
                cls._stop()  # a forked copy of the runtime never shares its parent's grading process
                cls._start()
            if not cls._ready:
                cls._await_ready()
            try:
                cls._conn.send_bytes(json.dumps([gold_answer, answer]).encode())
                if cls._conn.poll(DEADLINE_SECONDS):
                    return bool(json.loads(cls._conn.recv_bytes()))
            except (EOFError, OSError):
                pass  # the grading process died on this answer: it is wrong, and the next grade gets a new one
            cls._stop()
            cls._start()  # warms up (imports sympy) while the caller moves on
            return False


def _serve(fd: int) -> None:
    """The grading process: announce readiness, then answer [gold, answer] pairs until the parent goes away."""
    import math_verify  # noqa: F401 - imported before "ready" so that no grade pays for it

    conn = multiprocessing.connection.Connection(fd)
    conn.send_bytes(b"ready")
    while True:
        try:
            gold_answer, answer = json.loads(conn.recv_bytes())
        except EOFError:
            return
        conn.send_bytes(json.dumps(_equal(gold_answer, answer, TIMEOUT_SECONDS)).encode())


def is_correct(response: str, gold: str) -> bool:
    """True when the last stated answer of `response` equals `gold` mathematically.

    `gold` may be a bare answer ("18", "\\frac{1}{2}", "(1, 2)") or a worked solution ending in
    "#### 18" or a boxed answer. Unparseable answers are simply wrong; this never raises on model text,
    and takes at most about `DEADLINE_SECONDS` in any thread.
    """
    gold_answer = extract_final_answer(gold) if re.search(r"####|\\boxed|\\fbox", gold) else _tidy(gold)
    answer = extract_final_answer(response)
    if not answer or not gold_answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    if oversized(answer):
        return answer.strip() == gold_answer.strip()
    return _GradingProcess.equal(gold_answer, answer)
