"""One copy of the weights (`modelkit.weights`): a cycle trains its LoRA student on a view of the acting
model's base weights instead of loading them again, and ends with the same adapter."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from distill.opcd import OPCDConfig, TrainJob, run_job
from modelkit.weights import base_view, release_memory

LESSON = "Lessons from your past experience: always take coin."


def _room(i: int) -> list[dict]:
    return [
        {"role": "system", "content": "You play a text game. Reply with one command."},
        {"role": "user", "content": f"You are in room {i}. What do you do?"},
    ]


def _job(model_dir, output, **config) -> TrainJob:
    base = {"lr": 1e-2, "max_new_tokens": 6, "batch_size": 3, "steps": 2, "lora_r": 4, "lora_alpha": 8}
    return TrainJob(
        model_path=str(model_dir),
        config=OPCDConfig(**{**base, **config}),
        train_prompts=[_room(i) for i in range(4)],
        contexts=LESSON,
        kl_sets={"heldout": ([_room(9)], LESSON)},
        output=str(output),
    )


def _pointers(model) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def test_the_view_is_the_acting_models_base_weights_without_its_adapters(tiny_model_dir):
    acting = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        plain = acting(input_ids=ids).logits
    wrapped = get_peft_model(acting, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    view = base_view(wrapped)
    with torch.no_grad():
        assert torch.equal(view(input_ids=ids).logits, plain), "the adapter's layers are left out"
        assert not torch.equal(wrapped(input_ids=ids).logits, plain), "(the adapter does move the wrapped model)"
    base_storage = {p.untyped_storage().data_ptr() for n, p in wrapped.named_parameters() if "lora_" not in n}
    assert _pointers(view) == base_storage, "every parameter is the acting model's own storage: nothing copied"
    assert view.get_output_embeddings().weight is view.get_input_embeddings().weight, "tied weights stay tied"
    assert not any(p.requires_grad for p in view.parameters())


def test_a_job_on_shared_weights_trains_the_same_adapter_and_leaves_them_unchanged(tiny_model_dir, tmp_path):
    loaded = run_job(_job(tiny_model_dir, tmp_path / "loaded"))
    acting = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    before = {n: p.detach().clone() for n, p in acting.named_parameters()}
    shared = run_job(_job(tiny_model_dir, tmp_path / "shared"), shared_weights=acting)
    assert shared.kl_before == loaded.kl_before and shared.kl_after == loaded.kl_after
    a, b = (load_file(f"{tmp_path / name}/adapter_model.safetensors") for name in ("loaded", "shared"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(p, before[n]) for n, p in acting.named_parameters()), "training wrote no base weight"


@pytest.mark.parametrize("reason", ["dtype", "full_finetune"])
def test_weights_that_cannot_be_shared_are_loaded(tiny_model_dir, tmp_path, monkeypatch, reason):
    """A model in another dtype, or a full fine-tune (which writes the weights), loads its own copy."""
    import distill.opcd.job as job_module

    views = []
    monkeypatch.setattr(job_module, "base_view", lambda m: views.append(m) or base_view(m))
    acting = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = {"full_finetune": True} if reason == "full_finetune" else {}
    if reason == "dtype":
        acting = acting.to(torch.bfloat16)
    run_job(_job(tiny_model_dir, tmp_path / "out", **config), shared_weights=acting)
    assert not views
    run_job(_job(tiny_model_dir, tmp_path / "out2"), shared_weights=acting.float())
    assert len(views) == 1


def test_release_memory_frees_what_only_the_collector_can():
    class Holder:
        pass

    a, b = Holder(), Holder()
    a.other, b.other = b, a  # a reference cycle
    a.tensor = torch.ones(1000)
    alive = weakref.ref(a)
    gc.disable()
    try:
        del a, b
        assert alive() is not None
        release_memory()
        assert alive() is None
    finally:
        gc.enable()


@pytest.mark.slow
def test_bound_heap_returns_large_freed_tensors_to_the_system():
    """After `bound_heap`, a freed 64 MB tensor leaves the resident set at once; AGENT_RUNTIME_MALLOC=default opts out.

    Measured in a fresh interpreter, as the runtime sets it (at start): in a long test process glibc serves new
    allocations from free heap chunks earlier tests left, which no mapping threshold returns."""
    import os
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt")
    probe = (
        "import os, torch\n"
        "from agent_runtime.state.profile import memory_mb\n"
        "from modelkit.weights import bound_heap\n"
        "os.environ['AGENT_RUNTIME_MALLOC'] = 'default'\n"
        "assert bound_heap() is False\n"
        "del os.environ['AGENT_RUNTIME_MALLOC']\n"
        "assert bound_heap() is True\n"
        "before = memory_mb()['VmRSS']\n"
        "held = [torch.ones(2_000_000) for _ in range(8)]  # 8 x 8 MB, each above the 1 MB threshold\n"
        "grown = memory_mb()['VmRSS'] - before\n"
        "del held\n"
        "print(grown, memory_mb()['VmRSS'] - before)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "AGENT_RUNTIME_MALLOC"}
    done = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    grown, left = (float(x) for x in done.stdout.split())
    assert grown > 50
    assert left < 20
