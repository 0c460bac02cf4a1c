"""The models `bench/gpu_check.py` and `bench/gpu_check_vllm.py` measure: random-weight models of real shapes (no
weights and no internet on the GPU machine), the dry run's shrunken shape, and the device they run on.

`--cpu-dry-run` (the `args` every helper takes) swaps in `DRY_SHAPE` and the CPU, to check the logic without a GPU.
"""

from __future__ import annotations

import torch

SHAPES = {  # the real models' configs, minus the weights
    "qwen2.5-0.5b": (
        "Qwen2",
        {
            "hidden_size": 896,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "intermediate_size": 4864,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "rope_theta": 1e6,
            "tie_word_embeddings": True,
        },
    ),
    "qwen3-1.7b": (
        "Qwen3",
        {
            "hidden_size": 2048,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 6144,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "rope_theta": 1e6,
            "tie_word_embeddings": True,
        },
    ),
}
DRY_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}


def run_device(args) -> torch.device:
    """The CUDA GPU, or the CPU in a dry run."""
    return torch.device("cpu" if args.cpu_dry_run else "cuda")


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timing ends when it is done."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak(device: torch.device) -> str:
    """The peak GPU memory allocated, for a row's notes."""
    if device.type != "cuda":
        return "peak memory not tracked on CPU"
    return f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"


def build_model(shape: str, args, *, eos_token_id: int = 2, pad_token_id: int = 3):
    """A random-weight causal LM of `shape`, built directly on the device in bf16 (no fp32 copy on the host)."""
    import transformers

    family, kwargs = SHAPES[shape]
    kwargs = dict(kwargs)
    if args.cpu_dry_run:
        kwargs.update(DRY_SHAPE)
    if family == "Qwen2":
        kwargs.pop("head_dim", None)
    config = getattr(transformers, f"{family}Config")(
        **kwargs, eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=eos_token_id
    )
    model_cls = getattr(transformers, f"{family}ForCausalLM")
    device = run_device(args)
    torch.manual_seed(0)
    with device:
        model = model_cls._from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    return model.eval()


def n_params(model) -> int:
    """The model's parameter count."""
    return sum(p.numel() for p in model.parameters())  # tied embeddings are one parameter, counted once
