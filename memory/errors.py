"""Typed errors of the experience memory, each with a message that says what to do next.

They all derive from `MemoryStoreError`, so the CLI can catch one class and print the message.
"""

from __future__ import annotations


class MemoryStoreError(Exception):
    """Base class of every error the experience store raises on purpose."""


class NotADatabaseError(MemoryStoreError):
    """The target file is not an SQLite database, or not an agent-runtime memory database."""


class DatabaseTooNewError(MemoryStoreError):
    """The database was migrated by a newer agent-runtime than this one."""


class DatabaseOutdatedError(MemoryStoreError):
    """A read-only open found a database that needs migrating first."""


class StoreUnavailableError(MemoryStoreError):
    """The database server or file could not be reached or opened."""


class ReadOnlyStoreError(MemoryStoreError):
    """A write was attempted through a store opened with `read_only=True`."""


class NotFoundError(MemoryStoreError, KeyError):
    """A run, episode, lesson, ... with that id does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidRecordError(MemoryStoreError, ValueError):
    """A record given to the store breaks the schema's rules (unknown outcome, status, ...)."""


class ImportFormatError(MemoryStoreError):
    """A JSONL export file is malformed; the message names the line."""


class ImportConflictError(MemoryStoreError):
    """Importing would overwrite rows that already exist in the target store."""


class StoredRowError(MemoryStoreError):
    """A row already in the store breaks what its readers rely on (written around the store's checks, or before a
    check existed); the message names the row and the field."""
