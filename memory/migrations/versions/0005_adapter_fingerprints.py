"""Adapter fingerprints: which weights acted, next to which adapter was meant to.

- `episodes.adapter_fingerprint`: the fingerprint of the LoRA weights the acting backend had loaded when the
  episode started (what the backend reported; null for the base model, a backend that reports none, and every
  episode recorded before this revision).
- `adapters.fingerprint`: the fingerprint of the adapter files the trainer wrote (null for adapters registered
  before this revision or from files that were not there to hash).

Both are 64 hex characters (a SHA-256, `modelkit.fingerprint`). They are columns, not metadata, so that the
comparison is one join in SQL (the episodes whose weights differ from their adapter's, across a run) and an
import checks them as bounded strings. Nullable additions: existing databases convert in place, no rebuild.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("episodes", sa.Column("adapter_fingerprint", sa.String(length=64), nullable=True))
    op.add_column("adapters", sa.Column("fingerprint", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("adapters", "fingerprint")  # in place (SQLite >= 3.35): a rebuild would cascade
    op.drop_column("episodes", "adapter_fingerprint")
