"""The sections of `bench/gpu_check.sh`: generation and OPCD speed on one CUDA GPU, with random-weight models.

No weights and no internet on the GPU machine, so the models are random-weight models of real shapes
(Qwen2.5-0.5B for generation, Qwen3-1.7B for OPCD) and the tokenizer is the tiny byte-level BPE of
`agent_runtime.testing` (its ids are a subset of the model's vocabulary; a random model mostly samples ids
the tokenizer cannot spell, which costs nothing in speed but means the "actions" are empty: the rollout
numbers are about the generate path, not about play). Each section is one subcommand, run in its own
process by the shell script (so a crash or a timeout in one leaves the others alone); each prints its rows
as soon as they are measured and appends them to a JSONL file, and `report` prints the final table.

    python bench/gpu_check.py env|hf-generate|rollout|opcd|report --results R.jsonl [--cpu-dry-run]

`--cpu-dry-run` shrinks every shape and iteration count and runs on the CPU, to check the logic without a GPU.
Generation is measured with Hugging Face `generate` (the transformers backend); the `vllm` section measures the
vllm backend too when vLLM is importable (`bench/gpu_check_vllm.py`; on a CPU its dry run needs vLLM's CPU
build: `VLLM_PYTHON=<its python> bash bench/gpu_check.sh --cpu-dry-run`), and the shell script skips it with a
line saying so when it is not. What the two share lives beside them: the models (`bench/gpu_check_models.py`) and
the rollout rows (`bench/gpu_check_rollout.py`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.gpu_check_models import build_model, n_params, peak, run_device, sync
from bench.gpu_check_rollout import ROOM_TEXT, game_factory, rollout_row

H200_BF16_DENSE_FLOPS = 989e12
OPTIONAL = ("vllm", "trl", "textworld", "peft", "pydantic", "sqlalchemy", "flash_attn")
LESSONS = "\n".join(
    f"- EXPERIENCE ITEM: {t}"
    for t in [
        "Read the goal before you move; it names the room or the object you need.",
        "Try every exit of a room once before you go back the way you came.",
        "Take an object as soon as you see it when the goal mentions it.",
        "Open closed containers; the object you need is often inside.",
    ]
    * 4
)


class Results:
    """Rows of the final table, appended to a JSONL file as they are measured (so a timeout keeps them)."""

    def __init__(self, path: Path, section: str):
        self.path, self.section = path, section

    def add(self, setting: str, result: str, notes: str = "", **numbers) -> None:
        row = {"section": self.section, "setting": setting, "result": result, "notes": notes, **numbers}
        with self.path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(f"| {self.section} | {setting} | {result} | {notes} |", flush=True)


# -- sections ---------------------------------------------------------------------------------------------
def section_env(args, out: Results) -> None:
    import transformers

    device = "cpu (dry run)" if args.cpu_dry_run else "NO CUDA DEVICE"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    out.add(
        "machine",
        device,
        f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}",
    )
    present = {name: importlib.util.find_spec(name) is not None for name in OPTIONAL}
    out.add("optional packages", ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in present.items()))
    if not present["vllm"]:
        out.add(
            "vllm",
            "absent",
            "all generation below is Hugging Face generate (the transformers backend), "
            "the runtime's fallback; the vllm backend is not measured",
        )
    if not args.cpu_dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch; the GPU sections will fail (use --cpu-dry-run on a CPU)")


def section_hf_generate(args, out: Results) -> None:
    """Tokens/s of `model.generate` at several batch sizes, with the dynamic or the static (compiled) cache."""
    device = run_device(args)
    model = build_model("qwen2.5-0.5b", args)
    prompt_len, new_tokens, reps = (8, 4, 1) if args.cpu_dry_run else (args.prompt_len, args.new_tokens, args.reps)
    static = args.cache == "static"
    label = "static cache + torch.compile" if static else "dynamic cache"
    if static and device.type != "cuda":
        label = "static cache (no compile: transformers compiles only on GPU)"
    vocab = model.config.vocab_size
    for batch in [int(b) for b in args.batches.split(",")]:
        gen = torch.Generator(device="cpu").manual_seed(batch)
        ids = torch.randint(10, vocab - 1, (batch, prompt_len), generator=gen).to(device)
        kwargs = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "max_new_tokens": new_tokens,
            "min_new_tokens": new_tokens,
            "do_sample": True,
            "temperature": 0.7,
            "top_k": 0,
            "top_p": 1.0,
        }
        if static:
            kwargs["cache_implementation"] = "static"
        with torch.no_grad():
            start = time.perf_counter()
            model.generate(**kwargs)  # warm-up: first kernels, and for the static cache the compilation
            sync(device)
            first = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(reps):
                model.generate(**kwargs)
            sync(device)
            seconds = (time.perf_counter() - start) / reps
        tps = batch * new_tokens / seconds
        compiled = "compiled" if hasattr(model, "_compiled_call") else "not compiled"
        out.add(
            f"{label}, batch {batch}",
            f"{tps:,.0f} tokens/s",
            f"{seconds * 1000 / new_tokens:.1f} ms/step, prompt {prompt_len} + {new_tokens} new, "
            f"first call {first:.1f}s, {compiled}, {peak(device)}",
            tokens_per_s=tps,
            batch=batch,
            cache=args.cache,
        )


def section_rollout(args, out: Results) -> None:
    """The runtime's own path: EpisodeRunner -> TransformersBackend.generate on the GPU, 1/8/32 slots."""
    from agent_runtime.episode.prompt import PromptBuilder
    from agent_runtime.llm.base import SamplingParams
    from agent_runtime.llm.transformers_backend import TransformersBackend
    from agent_runtime.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = build_model("qwen2.5-0.5b", args, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    device = run_device(args)
    backend = TransformersBackend(model, tokenizer, device=device.type, dtype="bfloat16", context_window=4096)
    max_steps, new_tokens = (2, 4) if args.cpu_dry_run else (4, 32)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.7)
    factory, env_label = game_factory(args, max_steps)
    try:
        from agent_runtime.episode.runner import EpisodeRunner
    except ImportError as exc:  # the runner's module imports the experience store (sqlalchemy)
        out.add("runner", "not importable", f"{exc}; measuring backend.generate with batched chats instead")
        EpisodeRunner = None
    backend.generate([[{"role": "user", "content": "warm up"}]] * 2, params)
    for slots in [int(s) for s in args.slots.split(",")]:
        episodes = slots if args.cpu_dry_run else max(4, 2 * slots)
        builder = PromptBuilder(
            family="text",
            count_tokens=backend.count_tokens,
            context_window=backend.context_window,
            reserve_tokens=new_tokens,
        )
        try:
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
                device,
            )
        except Exception as exc:  # e.g. this transformers' cache API differs from the one tested
            if not backend.prefix_cache:
                raise
            out.add(
                f"rollout, {slots} slots",
                "FAILED with the prefix cache",
                f"{type(exc).__name__}: {str(exc)[:300]}; measuring with the prefix cache off",
            )
            backend.prefix_cache = False
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
                device,
            )


def section_opcd(args, out: Results) -> None:
    """Steps of `distill.opcd.OPCDTrainer` on a Qwen3-1.7B-shaped model: training tokens/s and MFU."""
    from agent_runtime.testing import tiny_tokenizer
    from distill.opcd import OPCDConfig, OPCDTrainer

    tokenizer = tiny_tokenizer()
    device = run_device(args)
    batch, new_tokens, steps = (
        (2, 4, 1) if args.cpu_dry_run else (args.opcd_batch, args.opcd_new_tokens, args.opcd_steps)
    )
    chats = [
        [
            {"role": "system", "content": "You are playing a text adventure game. Reply with one command."},
            {"role": "user", "content": ROOM_TEXT.format(room=f"room {i}", exit="north")},
        ]
        for i in range(batch)
    ]
    attempts = [("default config", {}), ("share_context_cache=False", {"share_context_cache": False})]
    for label, overrides in attempts:
        model = build_model(
            "qwen3-1.7b", args, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        params = n_params(model)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            config = OPCDConfig(batch_size=batch, max_new_tokens=new_tokens, steps=steps + 1, **overrides)
            trainer = OPCDTrainer(model, tokenizer, config)
            history = [trainer.step(chats, [LESSONS] * batch) for _ in range(steps + 1)]
        except Exception as exc:  # noqa: BLE001 - report and try the next configuration; the table must say what broke
            out.add(f"OPCD, {label}", "FAILED", f"{type(exc).__name__}: {str(exc)[:300]}")
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        timed = history[1:]  # the first step pays for kernel selection and allocator growth
        seconds = sum(m["seconds"] for m in timed)
        tokens = sum(m["tokens"] for m in timed)
        tps = tokens / seconds
        mfu = 6 * params * tps / H200_BF16_DENSE_FLOPS
        fractions = {k: sum(m[f"{k}_seconds"] for m in timed) / seconds for k in ("sample", "teacher", "train")}
        out.add(
            f"OPCD, {label}",
            f"{tps:,.0f} training tokens/s, MFU {mfu:.2%}",
            f"{params / 1e9:.2f}B params, batch {batch}, {tokens / len(timed):.0f} response tokens/step, "
            f"{seconds / len(timed):.2f} s/step (sample {fractions['sample']:.0%}, teacher "
            f"{fractions['teacher']:.0%}, train {fractions['train']:.0%}), warm-up step "
            f"{history[0]['seconds']:.1f}s, {peak(device)}; MFU = 6*params*tokens/s/989e12",
            tokens_per_s=tps,
            mfu=mfu,
        )
        return
    raise SystemExit("every OPCD configuration failed (see the rows above)")


def report(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    lines = ["| section | setting | result | notes |", "|---|---|---|---|"]
    lines += [f"| {r['section']} | {r['setting']} | {r['result']} | {r['notes']} |" for r in rows]
    return "\n".join(lines)


def section_vllm(args, out: Results) -> None:
    from bench.gpu_check_vllm import section_vllm as run

    run(args, out)


SECTIONS = {
    "env": section_env,
    "hf-generate": section_hf_generate,
    "rollout": section_rollout,
    "opcd": section_opcd,
    "vllm": section_vllm,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("section", choices=[*SECTIONS, "report"])
    parser.add_argument("--results", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes, 1-2 iterations, on the CPU")
    parser.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--slots", default="1,8,32")
    parser.add_argument("--vllm-slots", default="1,8,32,64")
    parser.add_argument("--synthetic", action="store_true", help="rollout on the synthetic env even with textworld")
    parser.add_argument("--opcd-batch", type=int, default=16)
    parser.add_argument("--opcd-new-tokens", type=int, default=128)
    parser.add_argument("--opcd-steps", type=int, default=2, help="timed steps (one warm-up step more is run)")
    args = parser.parse_args(argv)
    if args.section == "report":
        print(report(args.results))
        return 0
    SECTIONS[args.section](args, Results(args.results, args.section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
