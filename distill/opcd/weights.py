"""Memory of the weights: a plain view of a loaded model's frozen base weights, and handing freed memory back.

`base_view(model)` builds a new causal LM of the same class and config whose parameters *are* `model`'s base
weights (the same storage: nothing is copied, 0 bytes), with any LoRA layers that peft injected into `model`
left out, and its buffers (rotary frequencies) cloned. A LoRA training run on the view attaches its own adapter
to the view's modules and never writes a base weight, so the acting policy and the cycle's student, teacher and
parent share one copy of the weights (for SmolLM2-135M in float32: 513 MB less at the cycle's peak). A full
fine-tune writes the weights and must load its own copy (`load_model`).

`release_memory()` collects garbage (a trainer and its model sit in reference cycles that only the collector
frees) and asks glibc to return the free pages of its heaps to the system (`malloc_trim`): PyTorch's CPU tensors
come from malloc, and after a phase's large temporary tensors are freed the process would otherwise keep them
resident.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys

import torch


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


def release_memory() -> None:
    """Free what only the garbage collector can, and return glibc's free heap pages to the system."""
    gc.collect()
    if not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = getattr(libc, "malloc_trim", None)
    except OSError:  # not glibc (musl has no malloc_trim): nothing to hand back this way
        return
    if trim is not None:
        trim(0)
