"""The store's LoRA adapters: where each is on disk, what it was trained from, whether it is in use
(part of `ExperienceStore`).

What: `add_adapter(name, path, ..., fingerprint=) -> id`, `set_adapter_status(id, status)`, `get_adapter(id)`,
`adapters(run_id, status=)`, `active_adapter(run_id)`. Promotion, which moves two adapters' statuses
at once, is a cycle's business (`cycle_store`).

Why a row per adapter and never a file scan: the adapter registry must survive a crash and say which
adapter the agent plays with; files on disk say neither.
"""

from __future__ import annotations

from typing import Any

from memory.models import ADAPTER_STATUSES, Adapter
from memory.records import AdapterInfo, to_info
from memory.store_mixin import StoreMixin, check_value


class AdaptersMixin(StoreMixin):
    """Adapters (see module docstring)."""

    def add_adapter(
        self,
        name: str,
        path: str,
        *,
        run_id: int | None = None,
        parent_id: int | None = None,
        base_model: str | None = None,
        status: str = "candidate",
        metadata: dict[str, Any] | None = None,
        fingerprint: str | None = None,
    ) -> int:
        """Register an adapter saved at `path`; returns its id. `fingerprint` is the `modelkit.fingerprint` of the
        files the trainer wrote there (what episodes acting with it are checked against)."""
        check_value(status, ADAPTER_STATUSES, "adapter status")
        with self._write() as session:
            row = Adapter(
                run_id=run_id,
                name=name,
                path=path,
                parent_id=parent_id,
                base_model=base_model,
                status=status,
                meta=metadata or {},
                fingerprint=fingerprint,
            )
            session.add(row)
            session.flush()
            return row.id

    def set_adapter_status(self, adapter_id: int, status: str) -> None:
        check_value(status, ADAPTER_STATUSES, "adapter status")
        with self._write() as session:
            self._get(session, Adapter, adapter_id, "adapter").status = status

    def get_adapter(self, adapter_id: int) -> AdapterInfo:
        with self._read() as session:
            return to_info(AdapterInfo, self._get(session, Adapter, adapter_id, "adapter"))

    def adapters(self, run_id: int | None = None, *, status: str | None = None) -> list[AdapterInfo]:
        """Adapters, oldest first."""
        return self._listed(Adapter, AdapterInfo, run_id=run_id, status=status)

    def active_adapter(self, run_id: int | None = None) -> AdapterInfo | None:
        """The newest adapter with status "active" (of the run, if given), or None."""
        found = self.adapters(run_id, status="active")
        return found[-1] if found else None
