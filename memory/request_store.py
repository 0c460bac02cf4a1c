"""The store's run requests: what an operator asks of a running loop, carried out at its next phase boundary
(part of `ExperienceStore`).

What: `add_request(run_id, kind, payload) -> id`, `requests(run_id, kind=, pending=)`, `finish_request(id,
outcome)`. Today's kind is `reconsolidate` (`agent-runtime lessons forget` rolled the run's adapter back and
asks for a cycle on top of the ancestor it kept).

Why a table of its own: the run row's state belongs to the loop, which rewrites it with every episode, so a
second process (the CLI) must not write there; a request row is written once by the CLI and finished once by
the loop, in the transaction of the phase that carried it out.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from memory.models import RunRequest, utcnow
from memory.records import RequestInfo, to_info
from memory.store_mixin import StoreMixin


class RequestsMixin(StoreMixin):
    """Run requests (see module docstring)."""

    def add_request(self, run_id: int, kind: str, payload: dict[str, Any] | None = None) -> int:
        with self._write() as session:
            row = RunRequest(run_id=run_id, kind=kind, payload=payload or {}, created_at=utcnow(), outcome={})
            session.add(row)
            session.flush()
            return row.id

    def requests(self, run_id: int, *, kind: str | None = None, pending: bool | None = None) -> list[RequestInfo]:
        """The run's requests, oldest first; `pending` True: not done yet, False: done."""
        query = select(RunRequest).where(RunRequest.run_id == run_id)
        if kind is not None:
            query = query.where(RunRequest.kind == kind)
        if pending is not None:
            query = query.where(RunRequest.done_at.is_(None) if pending else RunRequest.done_at.is_not(None))
        with self._read() as session:
            return [to_info(RequestInfo, r) for r in session.scalars(query.order_by(RunRequest.id))]

    def finish_request(self, request_id: int, outcome: dict[str, Any] | None = None) -> None:
        """Mark a request done (once: finishing a done request keeps its first outcome)."""
        with self._write() as session:
            row = self._get(session, RunRequest, request_id, "run request")
            if row.done_at is None:
                row.done_at, row.outcome = utcnow(), outcome or {}
