"""What every part of `ExperienceStore` relies on: the facade's sessions, and the few reads they share.

Why parts: `ExperienceStore` is one object for callers (the loop, distill, the CLI, the dashboard), but
its ~50 methods are six families of tables with little in common. Each family lives in its own module
as a mixin (`lesson_store`, `lesson_set_store`, `cycle_store`, `adapter_store`, `evaluation_store`,
besides `retrieval` and `transfer`), and `store.py` composes them. This base says, once, what a part may
use from the facade (`url`, `_read()`, `_write()`) and holds the helpers more than one part needs:
`_get` (a row by id or `NotFoundError`), `_listed` (rows by equal columns), `same_run` and `check_value`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from memory.errors import InvalidRecordError, NotFoundError
from memory.models import Base
from memory.records import to_info


def same_run(column: Any, run_id: int | None) -> Any:
    """`column = run_id`, where a None run id matches rows that belong to no run."""
    return column.is_(None) if run_id is None else column == run_id


def check_value(value: str, allowed: Sequence[str], what: str) -> None:
    """Refuse a value outside its column's named values, naming them."""
    if value not in allowed:
        raise InvalidRecordError(f"unknown {what} {value!r}; known: {', '.join(allowed)}")


class StoreMixin:
    """The base of every part of `ExperienceStore` (see module docstring)."""

    if TYPE_CHECKING:  # provided by ExperienceStore
        url: str

        def _read(self) -> AbstractContextManager[Session]: ...

        def _write(self) -> AbstractContextManager[Session]: ...

    def _get(self, session: Session, model: type[Base], item_id: int, what: str) -> Any:
        row = session.get(model, item_id)
        if row is None:
            raise NotFoundError(f"no {what} with id {item_id} in {self.url}")
        return row

    def _listed(self, model: Any, info: Any, **equal: Any) -> list[Any]:
        """Rows of `model`, oldest first, whose columns equal the given values (None: any), as `info` records."""
        query = select(model).order_by(model.id)
        for column, value in equal.items():
            if value is not None:
                query = query.where(getattr(model, column) == value)
        with self._read() as session:
            return [to_info(info, r) for r in session.scalars(query)]
