"""FAISS indexes over stored vectors: exact when small, HNSW when large, saved atomically to disk.

What: `VectorIndex` holds one FAISS index of (item id, unit vector) pairs for one kind of item and one
embedder, searched by inner product (= cosine similarity for unit vectors). Up to `approx_threshold`
vectors it is exact (`IndexFlatIP`); above, approximate (`IndexHNSWFlat`, M=32), which needs no
training and takes incremental adds (see bench/memory_store.py for latency and recall@10). Its cost is
construction, which grows with the number of vectors (bench/RESULTS.md has the times), paid once when
an index crosses the threshold (or at `reindex`); later adds are incremental.

Why a cache: the vectors themselves live in SQL (`embeddings` table). The index file is derived data,
written atomically (temp file + rename) with a JSON sidecar describing it; anything that does not
match SQL -- a missing, unreadable or stale file, other ids -- is rebuilt from SQL by the caller
(`memory.retrieval`), so losing or corrupting an index file can never lose information.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import faiss
import numpy as np

HNSW_M = 32
HNSW_EF_CONSTRUCTION = 40
HNSW_EF_SEARCH = 64


@contextmanager
def _faiss_threads() -> Iterator[None]:
    """Run FAISS on AGENT_RUNTIME_FAISS_THREADS threads (default 1), restoring the setting after.

    One thread by default: a single-query search is too small to gain from splitting, and on a machine
    with few cores FAISS's OpenMP threads slow it and HNSW construction down severalfold. The OpenMP
    runtime is shared with torch, hence the restore.
    """
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(int(os.environ.get("AGENT_RUNTIME_FAISS_THREADS", "1")))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def index_paths(index_dir: Path, kind: str, model: str) -> tuple[Path, Path]:
    """(index file, sidecar) for one kind of item under one embedder."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
    stem = index_dir / f"{kind}-{safe}"
    return stem.with_suffix(".faiss"), stem.with_suffix(".json")


class VectorIndex:
    """One FAISS index of unit vectors keyed by item id (see module docstring)."""

    def __init__(self, dim: int, *, approximate: bool) -> None:
        self.dim = dim
        self.approximate = approximate
        if approximate:
            inner = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            inner.hnsw.efSearch = HNSW_EF_SEARCH
        else:
            inner = faiss.IndexFlatIP(dim)
        self.index = faiss.IndexIDMap2(inner)
        self._max_id = 0

    @classmethod
    def build(cls, ids: np.ndarray, vectors: np.ndarray, *, approx_threshold: int) -> VectorIndex:
        """A new index over `vectors` (rows) keyed by `ids`; approximate above the threshold."""
        made = cls(vectors.shape[1], approximate=len(ids) > approx_threshold)
        made.add(ids, vectors)
        return made

    @property
    def count(self) -> int:
        return int(self.index.ntotal)

    def ids(self) -> np.ndarray:
        """The item ids in the index (int64)."""
        return faiss.vector_to_array(self.index.id_map).astype(np.int64)

    def max_id(self) -> int:
        """The largest item id in the index (0 when empty); kept up to date, not recomputed."""
        return self._max_id

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        assert vectors.ndim == 2 and vectors.shape[1] == self.dim, (vectors.shape, self.dim)
        if len(ids):
            with _faiss_threads():
                self.index.add_with_ids(
                    np.ascontiguousarray(vectors, dtype=np.float32),
                    np.asarray(ids, dtype=np.int64),
                )
            self._max_id = max(self._max_id, int(np.max(ids)))

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The k nearest (id, score) pairs, best first; only among `allowed` ids if given."""
        if self.count == 0 or k <= 0:
            return []
        k = min(k, self.count)
        query = np.ascontiguousarray(query.reshape(1, -1), dtype=np.float32)
        if allowed is not None and len(allowed) == 0:
            return []
        with _faiss_threads():
            scores, found = self._search(query, k, allowed)
        return [(int(i), float(s)) for i, s in zip(found[0], scores[0]) if i >= 0]

    def _search(self, query: np.ndarray, k: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if allowed is None:
            scores, found = self.index.search(query, k)
        else:
            selector = faiss.IDSelectorBatch(np.asarray(allowed, dtype=np.int64))
            if self.approximate:
                params: faiss.SearchParameters = faiss.SearchParametersHNSW(
                    sel=selector, efSearch=max(HNSW_EF_SEARCH, 4 * k)
                )
            else:
                params = faiss.SearchParameters(sel=selector)
            scores, found = self.index.search(query, k, params=params)
        return scores, found

    def save(self, path: Path, sidecar: Path, meta: dict[str, object]) -> None:
        """Write the index and its sidecar atomically (a reader sees the old or the new file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        for target, write in (
            (path, lambda name: faiss.write_index(self.index, name)),
            (sidecar, lambda name: Path(name).write_text(json.dumps(meta, sort_keys=True))),
        ):
            fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=target.parent)
            os.close(fd)
            try:
                write(tmp)
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

    @classmethod
    def load(cls, path: Path, sidecar: Path) -> tuple[VectorIndex, dict[str, object]] | None:
        """The saved index and its sidecar, or None when either is missing or unreadable."""
        try:
            meta = json.loads(sidecar.read_text())
            raw = faiss.read_index(str(path))
        except (OSError, ValueError, RuntimeError):
            return None
        if not isinstance(raw, faiss.IndexIDMap2):
            return None
        loaded = cls.__new__(cls)
        loaded.dim = raw.d
        loaded.index = raw
        loaded.approximate = bool(meta.get("approximate"))
        ids = loaded.ids()
        loaded._max_id = int(ids.max()) if len(ids) else 0
        if loaded.approximate:
            faiss.downcast_index(raw.index).hnsw.efSearch = HNSW_EF_SEARCH
        return loaded, meta
