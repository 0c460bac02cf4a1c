"""Embeddings, FAISS indexes and similarity search over episodes and lessons (`ExperienceStore` mixin).

What (methods on `ExperienceStore`):
- `search_episodes(query, k=5, *, run_id=, env_id=, outcome=, won=) -> list[SearchHit]`: past
  episodes whose summary (env, goal or task id, first observation) is most similar to `query`
  (the agent's optional few-shot examples); `hit.item` is an `EpisodeInfo` without steps.
- `search_lessons(query, k=5, *, run_id=, status=, pool=, env_id=, ids=) -> list[SearchHit]`: the most
  similar lessons (an episode's lessons when more are in scope than its budget holds); `hit.item` is a
  `LessonInfo`.
- `embed_pending(kind=None) -> int`: compute and store the vectors that are missing (searches do
  this first on a writable store; the loop may call it after each phase to keep searches quick).
- `reindex(*, progress=None) -> dict`: embed what is missing, then rebuild every index from the
  vectors in SQL and save it (`agent-runtime memory reindex`).
- `index_status(check=False) -> dict`: per kind, vectors in SQL and in the index, exact or
  approximate, file, last sync; check=True loads and checks every index against SQL first.
`hit.score` is the cosine similarity (1.0 = same direction).

Why this design:
- Vectors are stored in SQL (`embeddings`, keyed by kind, embedder name and item id), so an index is
  only a cache: rebuilding it reproduces it exactly, and a changed embedder gets its own vectors.
- The first time a process uses an index it checks the file against SQL: same ids -> used as is;
  SQL has more -> the missing vectors are added; anything else (ids SQL does not have, unreadable
  file, other embedder or size) -> rebuilt. `last_index_sync[kind]` says which happened. Later
  searches only pick up vectors with a higher item id (a cheap indexed query).
- Filters are applied in SQL: the index is asked for 10k candidates, and if fewer than k pass the
  filters, it is searched again restricted to the ids that pass (FAISS ID selector), so a rare
  filter still gets its k best.
- A read-only store (the dashboard) never writes vectors or index files; it searches the vectors
  that exist.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import Select, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from memory.embeddings import Embedder, make_embedder
from memory.index import VectorIndex, index_paths
from memory.models import EMBEDDING_KINDS, Embedding, Episode, Lesson
from memory.records import EpisodeInfo, LessonInfo, SearchHit, to_info

EMBED_BATCH = 256
OVERFETCH = 10

Progress = Callable[[str, int, int], None]  # (what, done, total)


class RetrievalMixin:
    """Embeddings, indexes and search (see module docstring)."""

    if TYPE_CHECKING:  # provided by ExperienceStore
        url: str
        read_only: bool
        dialect: str

        def _read(self) -> AbstractContextManager[Session]: ...

        def _write(self) -> AbstractContextManager[Session]: ...

    def _init_retrieval(self, *, index_dir: Path, embedder: Embedder | str | None, approx_threshold: int) -> None:
        self.index_dir = index_dir
        self.approx_threshold = approx_threshold
        self._embedder: Embedder | None = None if isinstance(embedder, str | None) else embedder
        self._embedder_spec = embedder if isinstance(embedder, str) else None
        self._indexes: dict[str, VectorIndex] = {}
        self._index_lock = threading.RLock()
        self.last_index_sync: dict[str, str] = {}

    @property
    def embedder(self) -> Embedder:
        """The embedder (built on first use from the spec given to `open`)."""
        if self._embedder is None:
            self._embedder = make_embedder(self._embedder_spec)
        return self._embedder

    # -- vectors in SQL ------------------------------------------------------------------------

    def _pending_query(self, kind: str, *, newest_only: bool) -> Select[Any]:
        """Items of `kind` without a vector; newest_only: only those newer than the newest vector
        (one indexed range query, cheap enough to run before every search)."""
        model = Episode if kind == "episode" else Lesson
        text_col = Episode.summary if kind == "episode" else Lesson.text
        mine = (Embedding.kind == kind) & (Embedding.model == self.embedder.name)
        query = (
            select(model.id, text_col)
            .outerjoin(Embedding, mine & (Embedding.item_id == model.id))
            .where(Embedding.id.is_(None))
            .order_by(model.id)
        )
        if newest_only:
            newest = select(func.coalesce(func.max(Embedding.item_id), 0)).where(mine)
            query = query.where(model.id > newest.scalar_subquery())
        return query

    def embed_pending(self, kind: str | None = None, *, full: bool = True, progress: Progress | None = None) -> int:
        """Compute and store missing vectors; returns how many were added.

        full=False only looks at items newer than the newest embedded one (fast, used by searches).
        """
        if self.read_only:
            return 0
        added = 0
        for each in [kind] if kind else list(EMBEDDING_KINDS):
            with self._read() as session:
                pending = list(session.execute(self._pending_query(each, newest_only=not full)))
            for start in range(0, len(pending), EMBED_BATCH):
                batch = pending[start : start + EMBED_BATCH]
                vectors = self.embedder.embed([text for _, text in batch])
                rows = [
                    {
                        "kind": each,
                        "model": self.embedder.name,
                        "item_id": item_id,
                        "dim": vectors.shape[1],
                        "vector": vector.tobytes(),
                    }
                    for (item_id, _), vector in zip(batch, vectors)
                ]
                with self._write() as session:
                    dialect_insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
                    session.execute(dialect_insert(Embedding).on_conflict_do_nothing(), rows)
                added += len(batch)
                if progress:
                    progress(f"embed {each}s", start + len(batch), len(pending))
        return added

    def _vectors(self, session: Session, kind: str, *, after: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        query = select(Embedding.item_id, Embedding.vector).where(
            Embedding.kind == kind, Embedding.model == self.embedder.name
        )
        if after is not None:
            query = query.where(Embedding.item_id > after)
        rows = session.execute(query.order_by(Embedding.item_id)).all()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32)
        return ids, vectors.reshape(len(rows), -1) if rows else np.zeros((0, 0), np.float32)

    # -- indexes -------------------------------------------------------------------------------

    def _meta(self, kind: str, index: VectorIndex) -> dict[str, object]:
        return {
            "kind": kind,
            "model": self.embedder.name,
            "dim": index.dim,
            "count": index.count,
            "approximate": index.approximate,
        }

    def _build(self, kind: str, session: Session) -> VectorIndex:
        ids, vectors = self._vectors(session, kind)
        dim = vectors.shape[1] if len(ids) else self.embedder.dim
        if not len(ids):
            return VectorIndex(dim, approximate=False)
        return VectorIndex.build(ids, vectors, approx_threshold=self.approx_threshold)

    def _save(self, kind: str, index: VectorIndex) -> None:
        if not self.read_only:
            path, sidecar = index_paths(self.index_dir, kind, self.embedder.name)
            index.save(path, sidecar, self._meta(kind, index))

    def _load_checked(self, kind: str, session: Session) -> VectorIndex:
        """The saved index if it agrees with SQL (extended if SQL has more), else a rebuilt one."""
        path, sidecar = index_paths(self.index_dir, kind, self.embedder.name)
        loaded = VectorIndex.load(path, sidecar)
        if loaded is None:
            self.last_index_sync[kind] = "built" if not path.exists() else "rebuilt: unreadable"
            index = self._build(kind, session)
            self._save(kind, index)
            return index
        index, meta = loaded
        sql_ids = np.asarray(
            session.scalars(
                select(Embedding.item_id).where(Embedding.kind == kind, Embedding.model == self.embedder.name)
            ).all(),
            dtype=np.int64,
        )
        index_ids = index.ids()
        stale = np.setdiff1d(index_ids, sql_ids)
        if meta.get("model") != self.embedder.name or len(stale) or len(np.unique(index_ids)) != len(index_ids):
            self.last_index_sync[kind] = f"rebuilt: {len(stale)} ids not in SQL"
            index = self._build(kind, session)
            self._save(kind, index)
            return index
        missing = np.setdiff1d(sql_ids, index_ids)
        if len(missing):
            all_ids, vectors = self._vectors(session, kind)
            keep = np.isin(all_ids, missing)
            index.add(all_ids[keep], vectors[keep])
            self.last_index_sync[kind] = f"extended: {len(missing)} added"
            self._save(kind, index)
        else:
            self.last_index_sync[kind] = "loaded"
        return index

    def _index(self, kind: str) -> VectorIndex:
        """The up-to-date index of `kind` (loading, checking, extending as needed)."""
        with self._index_lock, self._read() as session:
            return self._sync_index(kind, session)

    def _sync_index(self, kind: str, session: Session) -> VectorIndex:
        with self._index_lock:
            index = self._indexes.get(kind)
            if index is None:
                index = self._load_checked(kind, session)
            else:
                ids, vectors = self._vectors(session, kind, after=index.max_id())
                if len(ids):
                    index.add(ids, vectors)
                    self._save(kind, index)
                    self.last_index_sync[kind] = f"extended: {len(ids)} added"
            if not index.approximate and index.count > self.approx_threshold:
                index = self._build(kind, session)
                self._save(kind, index)
                self.last_index_sync[kind] = f"rebuilt: approximate above {self.approx_threshold}"
            self._indexes[kind] = index
            return index

    def reindex(self, *, progress: Progress | None = None) -> dict[str, dict[str, Any]]:
        """Embed every item that lacks a vector, rebuild every index from SQL and save it."""
        self.embed_pending(full=True, progress=progress)
        with self._index_lock:
            for kind in EMBEDDING_KINDS:
                with self._read() as session:
                    index = self._build(kind, session)
                self._save(kind, index)
                self._indexes[kind] = index
                self.last_index_sync[kind] = "rebuilt: reindex"
                if progress:
                    progress(f"index {kind}s", index.count, index.count)
        return self.index_status()

    def index_status(self, *, check: bool = False) -> dict[str, dict[str, Any]]:
        """Per kind: vectors in SQL, vectors in the loaded index, exact or approximate, file, and
        how the index was last brought up to date (`sync`).

        check=True first loads every index and checks it against SQL (rebuilding one that
        disagrees); otherwise an index not used yet in this process reports `indexed: None`.
        """
        if check:
            for kind in EMBEDDING_KINDS:
                self._index(kind)
        status = {}
        with self._read() as session:
            for kind in EMBEDDING_KINDS:
                in_sql = session.scalar(
                    select(func.count(Embedding.id)).where(
                        Embedding.kind == kind, Embedding.model == self.embedder.name
                    )
                )
                index = self._indexes.get(kind)
                path, _ = index_paths(self.index_dir, kind, self.embedder.name)
                status[kind] = {
                    "embedder": self.embedder.name,
                    "vectors": int(in_sql or 0),
                    "indexed": index.count if index else None,
                    "approximate": index.approximate if index else None,
                    "path": str(path),
                    "sync": self.last_index_sync.get(kind),
                }
        return status

    # -- search --------------------------------------------------------------------------------

    def _search(self, kind: str, query: str, k: int, conditions: list[Any]) -> list[SearchHit]:
        self.embed_pending(kind, full=False)
        vector = self.embedder.embed([query])[0]
        model: Any = Episode if kind == "episode" else Lesson
        info = EpisodeInfo if kind == "episode" else LessonInfo
        with self._index_lock, self._read() as session:
            index = self._sync_index(kind, session)
            if not conditions:
                hits = index.search(vector, k)
            else:
                candidates = index.search(vector, k * OVERFETCH)
                ids = [i for i, _ in candidates]
                passing = set(session.scalars(select(model.id).where(model.id.in_(ids), *conditions)))
                hits = [(i, s) for i, s in candidates if i in passing][:k]
                if len(hits) < k and len(candidates) < index.count:
                    allowed = session.scalars(select(model.id).where(*conditions)).all()
                    hits = index.search(vector, k, allowed=np.asarray(allowed, dtype=np.int64))
            rows = {r.id: r for r in session.scalars(select(model).where(model.id.in_([i for i, _ in hits])))}
            return [SearchHit(i, s, to_info(info, rows[i])) for i, s in hits if i in rows]

    def search_episodes(
        self,
        query: str,
        k: int = 5,
        *,
        run_id: int | None = None,
        env_id: str | None = None,
        outcome: str | Sequence[str] | None = None,
        won: bool | None = None,
    ) -> list[SearchHit]:
        """The k stored episodes most similar to `query` (task text), best first."""
        conditions = []
        if run_id is not None:
            conditions.append(Episode.run_id == run_id)
        if env_id is not None:
            conditions.append(Episode.env_id == env_id)
        if outcome is not None:
            conditions.append(Episode.outcome.in_([outcome] if isinstance(outcome, str) else outcome))
        if won is not None:
            conditions.append(Episode.won.is_(won))
        return self._search("episode", query, k, conditions)

    def search_lessons(
        self,
        query: str,
        k: int = 5,
        *,
        run_id: int | None = None,
        status: str | Sequence[str] | None = None,
        pool: int | None = None,
        env_id: str | None = None,
        ids: Iterable[int] | None = None,
    ) -> list[SearchHit]:
        """The k stored lessons most similar to `query`, best first (among `ids` when given: the lessons an
        episode may see, `agent_runtime.phases.lesson_contexts.LessonContexts`)."""
        conditions = []
        if run_id is not None:
            conditions.append(Lesson.run_id == run_id)
        if status is not None:
            conditions.append(Lesson.status.in_([status] if isinstance(status, str) else status))
        if pool is not None:
            conditions.append(Lesson.pool == pool)
        if env_id is not None:
            conditions.append(Lesson.env_id == env_id)
        if ids is not None:
            conditions.append(Lesson.id.in_(list(ids)))
        return self._search("lesson", query, k, conditions)
