"""Secrets never written: configs are redacted before they reach the store, a file, an export or a page.

A run's config is stored with the run (`runs.config`), written beside it (`config.resolved.yaml`) and
carried by exports; a config can hold a database password (in `memory.url`) or an API key (a chat model's
`api_key` option). `redact_secrets` replaces every value whose key names a secret (api_key, password,
secret, token, credentials, ...) and the password inside any URL (`scheme://user:password@host`) with
`REDACTED`, leaving everything else as it was. A resumed run gets its secrets back from the config the
user gives (`restore_secrets`): the store never needs them.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"

_SECRET_KEY = re.compile(
    r"(^|[_-])(api[_-]?key|apikey|password|passwd|passphrase|secret|token|credentials?)$", re.IGNORECASE
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<password>[^@/\s]+)@")


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(str(key)))


def redact_text(text: str) -> str:
    """`text` with the password of every URL in it replaced."""
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}:{REDACTED}@", text)


def redact_secrets(data: Any) -> Any:
    """A copy of `data` (JSON-like: dicts, lists, scalars) with secret values and URL passwords redacted."""
    if isinstance(data, dict):
        return {
            k: (REDACTED if is_secret_key(k) and v not in (None, "") else redact_secrets(v)) for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact_secrets(v) for v in data]
    if isinstance(data, str):
        return redact_text(data)
    return data


def restore_secrets(stored: Any, given: Any) -> Any:
    """`stored` (a redacted config) with each redacted value taken from `given` where `given` redacts to the
    same thing there; a redacted value `given` does not supply stays redacted."""
    if isinstance(stored, dict) and isinstance(given, dict):
        out = {}
        for key, value in stored.items():
            if key not in given:
                out[key] = value
            elif value == REDACTED and is_secret_key(key):
                out[key] = given[key]
            else:
                out[key] = restore_secrets(value, given[key])
        return out
    if isinstance(stored, list) and isinstance(given, list) and len(stored) == len(given):
        return [restore_secrets(s, g) for s, g in zip(stored, given)]
    if isinstance(stored, str) and REDACTED in stored and redact_secrets(given) == stored:
        return given
    return stored
