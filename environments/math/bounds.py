"""How big a number an answer would make sympy compute, estimated from its LaTeX without computing it.

latex2sympy evaluates integer arithmetic eagerly: `9^{9^{9}}` becomes a 370-million-digit integer,
`1000000!`, `\\binom{10^7}{5 \\cdot 10^6}` and `\\prod_{i=1}^{10^6} i` millions of digits, each inside
C calls that hold the GIL and that no signal interrupts. `oversized(latex)` reads the answer once,
with a small recursive-descent parser that tracks only the order of magnitude (log10) of numeric
subexpressions, and names the first power, factorial, binomial or sum/product whose result would have
more than `MAX_RESULT_DIGITS` digits (or more than `MAX_TERMS` terms). Symbols have no magnitude
(`e^{x^2}` is fine), and anything the parser does not understand is skipped, never rejected: the grading
process's deadline (`environments.math.grading`) bounds what this estimate lets through.
"""

from __future__ import annotations

import math
import re

MAX_RESULT_DIGITS = 100_000  # 9^{99999} (95k digits) still parses quickly; 9^{999999} would take seconds
MAX_TERMS = 10_000
_TOKEN = re.compile(r"\\[a-zA-Z]+|\d+(?:\.\d+)?|\*\*|\S")
_SKIP = {"\\left", "\\right", "\\,", "\\;", "\\!", "\\quad", "\\displaystyle", "\\big", "\\Big"}
_TIMES = {"*", "\\cdot", "\\times"}
_FRACS = {"\\frac", "\\dfrac", "\\tfrac"}
_BINOMS = {"\\binom", "\\dbinom", "\\tbinom"}
_BIG_OPS = {"\\sum", "\\prod"}
_OPEN = {"(": ")", "[": "]", "{": "}"}


class _TooBig(Exception):
    pass


class _Estimate:
    """Parser state; magnitudes are log10(|value|), None for symbolic or unknown."""

    def __init__(self, latex: str) -> None:
        self.tokens = [t for t in _TOKEN.findall(latex) if t not in _SKIP]
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.i += token is not None
        return token

    def sum(self, closer: str | None = None) -> float | None:
        value = self.product(closer)
        while self.peek() in ("+", "-", "=", "<", ">", ","):
            self.take()
            other = self.product(closer)
            value = None if value is None or other is None else max(value, other) + 0.31
        return value

    def product(self, closer: str | None) -> float | None:
        value = self.power()
        while (
            (token := self.peek()) is not None
            and token not in ("+", "-", "=", "<", ">", ",", closer)
            and token not in _OPEN.values()
        ):
            divide = token == "/"
            if token in _TIMES or divide:
                self.take()
            other = self.power()
            if value is not None and other is not None:
                value = value - other if divide else value + other
            else:
                value = None
        return value

    def power(self) -> float | None:
        value = self.atom()
        while self.peek() in ("^", "**", "!"):
            if self.take() == "!":
                value = self._factorial(value)
                continue
            exponent = self.atom()
            value = self._power(value, exponent)
        return value

    def atom(self) -> float | None:
        token = self.take()
        if token is None:
            return None
        if token[0].isdigit():
            number = float(token)
            return math.log10(number) if number > 0 else -math.inf
        if token in _OPEN:
            inner = self.sum(_OPEN[token])
            if self.peek() == _OPEN[token]:
                self.take()
            return inner
        if token in _FRACS:
            top, bottom = self.atom(), self.atom()
            return None if top is None or bottom is None else top - bottom
        if token in _BINOMS:
            n, _ = self.atom(), self.atom()
            self._check_digits(self._value(n) * math.log10(2), "binomial coefficient")
            return None
        if token in _BIG_OPS:
            return self._big_op(token)
        if token == "\\sqrt":
            if self.peek() == "[":
                self.take()
                self.sum("]")
                self.take()
            inner = self.atom()
            return None if inner is None else inner / 2
        if token == "-":
            return self.atom()
        if token.startswith("\\") and self.peek() in _OPEN and token not in ("\\pi", "\\infty"):
            self.atom()  # a function's argument may hide a tower: \sin(9^{9^{9}})
        return None

    def _big_op(self, op: str) -> None:
        upper = None
        for _ in range(2):
            marker = self.peek()
            if marker not in ("_", "^"):
                break
            self.take()
            bound = self.atom()
            if marker == "^":
                upper = bound
        if upper is not None and self._value(upper) > MAX_TERMS:
            raise _TooBig(f"{op[1:]} over more than {MAX_TERMS} terms")
        self.power()

    @staticmethod
    def _value(magnitude: float | None) -> float:
        if magnitude is None:
            return 0.0
        return math.inf if magnitude > 300 else 10.0**magnitude

    def _check_digits(self, digits: float, what: str) -> None:
        if digits > MAX_RESULT_DIGITS:
            raise _TooBig(f"{what} with about {digits:.3g} digits")

    def _power(self, base: float | None, exponent: float | None) -> float | None:
        if base is None or exponent is None:
            return None
        digits = self._value(exponent) * max(base, 0.0)
        self._check_digits(digits, "power")
        return digits

    def _factorial(self, operand: float | None) -> float | None:
        if operand is None:
            return None
        n = self._value(operand)
        digits = n * math.log10(max(n, 1.0) / math.e) if n > 3 else 1.0
        self._check_digits(digits, "factorial")
        return digits


def oversized(latex: str) -> str | None:
    """Why computing `latex` would be too big (e.g. "power with about 3.7e+08 digits"), or None."""
    estimate = _Estimate(latex)
    try:
        while estimate.peek() is not None:  # a stray closer ("[1, 3)") ends a sum, not the reading
            start = estimate.i
            estimate.sum()
            if estimate.i == start:
                estimate.take()
    except _TooBig as why:
        return str(why)
    except (RecursionError, ValueError, OverflowError):
        return None
    return None
