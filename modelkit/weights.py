"""Memory of the weights: a plain view of a loaded model's frozen base weights, and handing freed memory back.

`base_view(model)` builds a new causal LM of the same class and config whose parameters *are* `model`'s base
weights (the same storage: nothing is copied, 0 bytes), with any LoRA layers that peft injected into `model`
left out, and its buffers (rotary frequencies) cloned. A LoRA training run on the view attaches its own adapter
to the view's modules and never writes a base weight, so the acting policy and the cycle's student, teacher and
parent share one copy of the weights (a whole model's weights less at the cycle's peak). A full
fine-tune writes the weights and must load its own copy (`load_model`).

`release_memory()` collects garbage (a trainer and its model sit in reference cycles that only the collector
frees) and asks glibc to return the free pages of its heaps to the system (`malloc_trim`): PyTorch's CPU tensors
come from malloc, and after a phase's large temporary tensors are freed the process would otherwise keep them
resident. `bound_heap()` (called once by a run) keeps glibc from holding them in the first place: allocations of
1 MB and more are mapped and unmapped on their own (`M_MMAP_THRESHOLD` fixed; by default glibc raises the
threshold after the first large free, and later large tensors then come from the heap, where freed space stays
resident). What it buys: a lower peak during a training step and far less memory kept resident after it, at the
same step time.
`AGENT_RUNTIME_MALLOC=default` leaves glibc's settings alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

import torch


def can_share(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a view of `model`'s weights serves as a `dtype` model on `device` (no cast, no move)."""
    weight = next(model.parameters())
    same_device = weight.device.type == device.type and (device.index is None or weight.device == device)
    return weight.dtype == dtype and same_device


def base_view(model) -> torch.nn.Module:
    """A plain causal LM (`type(model)` or peft's base model's type) whose parameters alias `model`'s base
    weights, frozen; raises ValueError when `model` has a base weight the view does not (another architecture)."""
    from peft import PeftModel

    lm = model.get_base_model() if isinstance(model, PeftModel) else model
    sources: dict[str, torch.Tensor] = {}
    for name, param in lm.named_parameters(remove_duplicate=False):
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue  # an adapter's own weights
        sources[".".join(p for p in parts if p != "base_layer")] = param
    buffers = {".".join(p for p in n.split(".") if p != "base_layer"): b for n, b in lm.named_buffers()}
    with torch.device("meta"):
        view = type(lm)(lm.config)
    aliases: dict[int, torch.nn.Parameter] = {}  # tied weights stay one parameter
    for name, _ in list(view.named_parameters(remove_duplicate=False)):
        if name not in sources:
            raise ValueError(f"{type(lm).__name__} has no weight {name!r} to share")
        source = sources.pop(name)
        alias = aliases.setdefault(id(source), torch.nn.Parameter(source.detach(), requires_grad=False))
        module_name, _, leaf = name.rpartition(".")
        view.get_submodule(module_name)._parameters[leaf] = alias
    if sources:
        raise ValueError(f"the view of {type(lm).__name__} leaves out weights: {sorted(sources)[:3]}")
    for name, _ in list(view.named_buffers()):
        module_name, _, leaf = name.rpartition(".")
        view.get_submodule(module_name)._buffers[leaf] = buffers[name].clone()
    view.generation_config = lm.generation_config
    return view.eval()


MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def bound_heap() -> bool:
    """Serve allocations of `MMAP_THRESHOLD` bytes and more by their own mappings, returned to the system when freed
    (glibc only; False where it does not apply or `AGENT_RUNTIME_MALLOC=default`)."""
    if os.environ.get("AGENT_RUNTIME_MALLOC", "").strip().lower() == "default":
        return False
    mallopt = getattr(_libc(), "mallopt", None)  # not glibc (musl): nothing to set
    return bool(mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_memory() -> None:
    """Free what only the garbage collector can, and return glibc's free heap pages to the system."""
    gc.collect()
    trim = getattr(_libc(), "malloc_trim", None)  # not glibc (musl has no malloc_trim): nothing to hand back
    if trim is not None:
        trim(0)
