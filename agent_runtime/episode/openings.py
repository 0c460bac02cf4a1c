"""An episode's opening (its first observation) as a key: whitespace runs made single spaces, then hashed. The
held-out set knows its tasks by it (`evaluation.heldout`), and the retrieved examples tell the game being played
by it (`episode.examples`), so the two always compare the same way."""

from __future__ import annotations

import hashlib


def normal_text(text: str) -> str:
    """`text` with its whitespace runs made single spaces (what an opening is compared by)."""
    return " ".join(text.split())


def observation_hash(text: str) -> str:
    return hashlib.sha256(normal_text(text).encode()).hexdigest()
