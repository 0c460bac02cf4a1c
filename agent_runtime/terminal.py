"""Text safe to print on a terminal: `shown(text)`, the one escaping every printed path goes through.

Text from a config, a store, an environment or a model (env ids, curriculum phase names, lessons, goals, error
messages that quote them) came from someone else; printed raw, an escape sequence in it would drive the terminal
(move the cursor, rewrite earlier lines, set the window title or the clipboard with OSC 0 / OSC 52). C0 and C1
control characters (and DEL, and lone surrogates, which a UTF-8 terminal cannot even be sent) become visible
escapes (`\\x1b`, `\\x9b`, `\\ud800`). It lives on the lowest floor so that the commands and the run loop's
console lines use the same function.
"""

from __future__ import annotations

import re

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_UNPRINTABLE_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return {9: "\\t", 10: "\\n", 13: "\\r"}.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def shown(text: object, *, multiline: bool = False) -> str:
    """`text` safe to print on a terminal: control characters (C0, DEL, C1) and lone surrogates escaped, as
    `\\x1b`, `\\n`, `\\ud800`. A newline and a tab stay when `multiline` (text meant to span lines);
    otherwise they are escaped too, so one stored text prints as one line."""
    text = str(text)
    return (_UNPRINTABLE_BUT_LINES if multiline else _UNPRINTABLE).sub(_escape, text)
