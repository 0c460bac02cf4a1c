"""The `vllm` section of `bench/gpu_check.sh`: the vllm backend's rollout rate with prefix caching, and how long
a LoRA hot swap takes, and how long the engine takes to sleep and wake around an OPCD cycle, on a
random-weight Qwen2.5-0.5B-shaped model.

No weights on the GPU machine: vLLM builds the model from its config with random weights (`load_format:
dummy`), next to the tiny byte-level tokenizer of `agent_runtime.testing` (as the other sections do). The LoRA
adapter is random too (rank 16 on every linear layer, in the layout peft writes), so the swap costs what a
promoted OPCD adapter of that rank costs. Rows:

- rollout, N slots: `EpisodeRunner` -> `VLLMBackend.generate`, prefix caching on (vLLM's default): episodes/min
  and generated tokens/s, as the transformers rows of the rollout section measure them;
- LoRA: `load_adapter` (the engine reads and registers the adapter), the first batch with it, and a batch of 8
  with the base model vs the adapter (the steady cost of an unmerged LoRA);
- sleep mode: how long the engine takes to sleep and to wake, and the GPU's free memory awake, asleep and after
  waking (what an OPCD cycle training on the same GPU gets back).

Imported by `bench/gpu_check.py vllm` only when vLLM is importable; `--cpu-dry-run` runs it on vLLM's CPU build
with a model of a few MB.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from bench.gpu_check_models import DRY_SHAPE, SHAPES
from bench.gpu_check_rollout import ROOM_TEXT, game_factory, rollout_row

DRY_VLLM_SHAPE = {**DRY_SHAPE, "hidden_size": 256, "head_dim": 64, "intermediate_size": 512}  # CPU kernels
LORA_RANK = 16


def write_model(directory: Path, args) -> Path:
    """config.json of the Qwen2.5-0.5B shape (or the dry-run shape) and the tiny tokenizer: all vLLM needs to
    build the model with random weights."""
    import transformers

    from agent_runtime.testing import tiny_tokenizer

    family, kwargs = SHAPES["qwen2.5-0.5b"]
    kwargs = {**kwargs, **(DRY_VLLM_SHAPE if args.cpu_dry_run else {})}
    tokenizer = tiny_tokenizer()
    config = getattr(transformers, f"{family}Config")(
        **kwargs,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
        architectures=[f"{family}ForCausalLM"],
    )
    config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_lora(directory: Path, model_dir: Path) -> Path:
    """A random rank-16 LoRA on every attention and MLP projection, as peft saves one."""
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head
    shapes = {
        "self_attn.q_proj": (hidden, config["num_attention_heads"] * head),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (config["num_attention_heads"] * head, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name, (fan_in, fan_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(LORA_RANK, fan_in, generator=generator) / fan_in**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, LORA_RANK, generator=generator) * 0.01
    directory.mkdir(parents=True)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, directory / "adapter_model.safetensors"
    )
    (directory / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": LORA_RANK,
                "lora_alpha": 2 * LORA_RANK,
                "lora_dropout": 0.0,
                "bias": "none",
                "base_model_name_or_path": str(model_dir),
                "target_modules": sorted({n.split(".")[-1] for n in shapes}),
            }
        )
    )
    return directory


def section_vllm(args, out) -> None:
    from agent_runtime.episode.prompt import PromptBuilder
    from agent_runtime.llm.base import SamplingParams
    from agent_runtime.llm.vllm_backend import VLLMBackend

    work = Path(tempfile.mkdtemp(prefix="gpu-check-vllm-"))
    model_dir = write_model(work / "model", args)
    adapter = write_lora(work / "lora", model_dir)
    started = time.perf_counter()
    backend = VLLMBackend(
        str(model_dir),
        dtype="bfloat16",
        context_window=4096,
        load_format="dummy",
        max_lora_rank=LORA_RANK,
        enable_prefix_caching=True,
    )
    out.add(
        "engine",
        f"up in {time.perf_counter() - started:.1f}s",
        f"platform {backend.platform}, {backend.dtype}, random weights (load_format dummy), prefix caching on",
    )
    max_steps, new_tokens = (2, 4) if args.cpu_dry_run else (4, 32)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.7)
    factory, env_label = game_factory(args, max_steps)
    try:
        from agent_runtime.episode.runner import EpisodeRunner
    except ImportError as exc:  # the runner's module imports the experience store (sqlalchemy)
        out.add("runner", "not importable", f"{exc}; measuring backend.generate with batched chats instead")
        EpisodeRunner = None
    backend.generate([[{"role": "user", "content": "warm up"}]] * 2, params)
    memory = "memory: the engine's own process (vLLM V1)"
    slot_counts = [1, 4] if args.cpu_dry_run else [int(s) for s in args.vllm_slots.split(",")]
    for slots in slot_counts:
        episodes = slots if args.cpu_dry_run else max(4, 2 * slots)
        builder = PromptBuilder(
            family="text",
            count_tokens=backend.count_tokens,
            context_window=backend.context_window,
            reserve_tokens=new_tokens,
        )
        rollout_row(
            args,
            out,
            backend,
            builder,
            params,
            factory,
            env_label,
            EpisodeRunner,
            slots,
            episodes,
            max_steps,
            new_tokens,
            torch.device("cpu"),
            label="vllm rollout",
            memory=memory,
        )
    _lora_rows(backend, adapter, out, args)
    _sleep_row(backend, out)
    backend.close()


def _sleep_row(backend, out) -> None:
    """What an OPCD cycle next to the engine costs it and gives the cycle: sleep (weights offloaded, KV cache
    dropped) and wake, and the device's free memory awake, asleep and woken again (device-wide: vLLM's engine
    runs in processes of its own, so this process's allocator does not see its memory)."""

    def free_gib() -> float:
        return torch.cuda.mem_get_info()[0] / 2**30 if torch.cuda.is_available() else float("nan")

    awake = free_gib()
    start = time.perf_counter()
    if not backend.sleep():
        out.add(
            "sleep mode",
            "not available",
            f"platform {backend.platform}: the engine keeps its memory while a "
            "cycle trains (the CPU build has no sleep mode)",
        )
        return
    slept = time.perf_counter() - start
    asleep = free_gib()
    start = time.perf_counter()
    backend.wake_up()
    woke = time.perf_counter() - start
    woken = free_gib()
    out.add(
        "sleep mode",
        f"sleep {slept:.2f}s, wake {woke:.2f}s",
        f"GPU memory free: {awake:.1f} GiB awake, {asleep:.1f} GiB asleep ({asleep - awake:+.1f} GiB for a "
        f"cycle), {woken:.1f} GiB after waking",
        sleep_s=slept,
        wake_s=woke,
        free_awake_gib=awake,
        free_asleep_gib=asleep,
        free_woken_gib=woken,
    )


def _lora_rows(backend, adapter: Path, out, args) -> None:
    """Swap latency: register and load the adapter, its first batch, then base vs adapter at batch 8."""
    from agent_runtime.llm.base import SamplingParams

    chats = [[{"role": "user", "content": ROOM_TEXT.format(room=f"room {i}", exit="north")}] for i in range(8)]
    new_tokens = 4 if args.cpu_dry_run else 64
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)

    def timed(label: str | None) -> float:
        backend.use_adapter(label)
        start = time.perf_counter()
        backend.generate(chats, params)
        return time.perf_counter() - start

    base = min(timed(None) for _ in range(2))
    start = time.perf_counter()
    backend.load_adapter("lora", adapter)
    load = time.perf_counter() - start
    first = timed("lora")
    steady = min(timed("lora") for _ in range(2))
    back = timed(None)
    out.add(
        "LoRA hot swap",
        f"load {load * 1000:.0f} ms, first batch {first * 1000:.0f} ms",
        f"rank {LORA_RANK} on 7 projections per layer; batch 8 x {new_tokens} tokens: base {base * 1000:.0f} ms, "
        f"with the adapter {steady * 1000:.0f} ms ({steady / base:.2f}x), back to base {back * 1000:.0f} ms",
        load_ms=load * 1000,
        first_ms=first * 1000,
        base_ms=base * 1000,
        adapter_ms=steady * 1000,
    )
