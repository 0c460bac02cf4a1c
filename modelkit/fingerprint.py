"""The fingerprint of a LoRA adapter's weights: one hash, computed the same way from the tensors a backend holds
and from the files a trainer wrote, so that "which adapter acted" is a comparison of two strings.

What is hashed. The adapter's LoRA tensors under their canonical names, the keys peft writes to
`adapter_model.safetensors` (`base_model.model.<module path>.lora_A.weight`, with no adapter name in them:
what `peft.get_peft_model_state_dict(model, adapter_name=...)` returns for a loaded adapter). In the order of
the sorted names, each tensor adds its name, its shape and its values as little-endian float32, C order, to one
SHA-256; the fingerprint is the hex digest. Nothing else: not `adapter_config.json` (rank and alpha are fixed
by the shapes and the trainer's config; a changed alpha over the same tensors is the post-promotion probe's to
catch, `agent_runtime.phases.probe`), not the file layout, not the device.

Why float32. Every dtype an adapter is stored or held in (float32, bfloat16, float16) widens to float32
exactly, so the same weights give the same bytes wherever they are: the trainer's float32 file, peft's copy in
a model loaded in bfloat16 (peft keeps adapter weights in float32 and loads the file's values unchanged), and
the file handed to vLLM (whose engine may cast it to bfloat16 afterwards; what it was given is what is hashed,
since vLLM does not expose its copy). Two adapters that differ only below float32 precision cannot exist: the
file holds no more.

Comparable across backends, then, by construction: the transformers backend hashes the tensors in its model
after loading (`fingerprint_state`); vLLM in process, in its child process, and a vLLM server reached through
the chat backend hash the files they gave the engine (`fingerprint_files`); the consolidation cycle hashes the
files its trainer wrote, recorded on the adapter's row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import torch

WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def fingerprint_state(tensors: Mapping[str, torch.Tensor]) -> str:
    """The fingerprint of an adapter's tensors by canonical name (see the module docstring)."""
    assert tensors, "an adapter without tensors has no fingerprint"
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to(device="cpu", dtype=torch.float32).contiguous()
        digest.update(name.encode())
        digest.update(repr(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().astype("<f4", copy=False).tobytes())
    return digest.hexdigest()


def adapter_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of the peft adapter directory `path`, by the names stored in its weight file."""
    path = Path(path)
    for name in WEIGHT_FILES:
        weights = path / name
        if weights.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(weights), device="cpu")
            return torch.load(weights, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no adapter weights in {path} (looked for {', '.join(WEIGHT_FILES)})")


def fingerprint_files(path: str | Path) -> str:
    """The fingerprint of the adapter written at `path` (its weight file, read now)."""
    return fingerprint_state(adapter_tensors(path))
