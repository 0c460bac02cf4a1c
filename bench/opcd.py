"""OPCD training speed and memory, beside TRL's SDFTTrainer doing the same work.

Prints a markdown table: training tokens/s (response tokens trained on per second of wall time, warm-up step
excluded), seconds per step and where they go, and peak resident memory (the highest over repeats; the
timings are those of the fastest repeat, the least disturbed by other processes), for OPCD on a tiny model and on
SmolLM2-135M-Instruct, with TRL's `trl.experimental.sdft.SDFTTrainer` configured to match: reverse KL
(distillation_alpha=1) on the student's top-k (256), the base model as teacher (LoRA disabled), one sample per
prompt, the lesson context before the prompt in the teacher's template, the same LoRA, learning rate,
temperature, completion length, batch size and seed, no importance-sampling clip.

Each configuration runs in its own subprocess so that peak RSS (`ru_maxrss`) belongs to it alone; "over
model" is the peak minus the RSS right after the model was loaded. OPCD variants: `plain` samples from the
live (unmerged LoRA) model and runs the teacher over every row's full prompt; `merged-fp32` samples from an
fp32 merged copy; `default` is the shipped configuration (bf16 merged copy + the shared-prefix teacher cache, its
prefix run once for the whole run); `teacher-per-step` is `default` with that prefix run again every step.
These use gradient checkpointing (the default, as in TRL); `nogc` is `default` without it, to compare with
`trl-nogc`, TRL without it. `bf16` is `default` on a model whose weights are bfloat16 (as `opcd.trainer.weights_dtype:
bfloat16` trains; the LoRA weights stay float32), to compare with `trl-bf16`: TRL given the same bf16 model, with its
`bf16=True` (autocast).

    .venv/bin/python bench/opcd.py         # tiny + smollm2, all variants, TRL if installed, 1 and 2 threads
    .venv/bin/python bench/opcd.py --models smollm2 --variants default,trl --repeat 2
    .venv/bin/python bench/opcd.py --models tiny --steps 2 --threads 1

Each thread count is a block of rows; the last two columns compare a row with TRL's at the same thread count and
gradient checkpointing (`nogc` with `trl-nogc` when both ran): its tokens/s over TRL's, and TRL's seconds per
step over its own (above 1 is faster than TRL).

TRL is the `bench` extra (`pip install trl==1.16.0` and its `datasets` dependency); without it the table
says so in a row of its own. To keep the project's environment as it is, install it apart, but inside the
environment's folder, and put that folder on PYTHONPATH:

    .venv/bin/pip install --target .venv/trl-extra --no-deps trl==1.16.0 datasets==5.2.0 dill==0.4.1 \
        multiprocess==0.70.19 pandas==3.1.1 pyarrow==26.0.1
    PYTHONPATH=$PWD/.venv/trl-extra .venv/bin/python bench/opcd.py --models smollm2 --variants default,trl

A folder outside the environment (`--target /tmp/x`) fails in `datasets.Dataset.from_list` with "Can't pickle
<class 'MonthDayNano'>": `datasets` hashes a dataset with dill, and dill pickles by value any module whose file is
not under `sys.prefix`, so it walks into pyarrow's internals.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEM = "You are a careful assistant. Solve the problem and give the final answer as \\boxed{N}."
QUESTIONS = [
    f"A shop sells {a} boxes of {b} pencils and {c} loose pencils. How many pencils is that?"
    for a, b, c in [
        (3, 12, 5),
        (7, 6, 2),
        (4, 9, 11),
        (12, 3, 8),
        (5, 5, 5),
        (9, 8, 1),
        (2, 14, 6),
        (6, 7, 3),
        (8, 4, 9),
        (11, 2, 7),
        (10, 10, 4),
        (13, 5, 2),
    ]
]
LESSONS = "\n".join(
    f"- EXPERIENCE ITEM: {text}"
    for text in [
        "Write the quantities down first, then the operation that combines them.",
        "Multiply the number of boxes by the pencils per box before adding loose items.",
        "Check the final sum by estimating: it must be close to boxes times items per box.",
        "Never skip the loose items; they are easy to forget at the end.",
        "State the answer once, inside \\boxed{}, with no units.",
        "When two numbers are large, split the multiplication into tens and ones.",
        "Re-read the question after computing to make sure the asked quantity is the one computed.",
        "Prefer short sentences; each line of working should contain one operation.",
    ]
    * 3
)


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _load(model_name: str, dtype: str = "float32"):
    """The model (its weights in `dtype`) and its tokenizer."""
    import torch

    if model_name == "tiny":
        from agent_runtime.testing import tiny_model_and_tokenizer

        model, tok = tiny_model_and_tokenizer("llama", hidden_size=128, layers=4, heads=4)
        return model.to(getattr(torch, dtype)), tok
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from agent_runtime.checkpoints import resolve_model

    path = resolve_model("smollm2-135m-instruct")
    # A checkpoint converted from GGUF may still carry the GGUF quantization_config: transformers then keeps the
    # weights packed (slower matmuls, and TRL refuses to train it). Load the plain fp32 weights it holds.
    config = AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32)
    model.to(getattr(torch, dtype))
    with torch.no_grad():  # fault the memory-mapped weights in, so "over model" excludes them
        sum(float(p.sum()) for p in model.parameters())
    return model, AutoTokenizer.from_pretrained(path)


def _chats(n: int) -> list[list[dict]]:
    return [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        for i in range(n)
    ]


def run_opcd(model_name: str, variant: str, args) -> dict:
    import torch

    from distill.opcd import OPCDConfig, OPCDTrainer

    model, tok = _load(model_name, "bfloat16" if variant == "bf16" else "float32")
    loaded = _rss_mib()
    options = {
        "plain": {"sampler": "live", "share_context_cache": False},
        "merged-fp32": {"sampler": "merged-fp32", "share_context_cache": False},
        "default": {},
        "bf16-sampler": {"sampler": "merged-bf16"},  # the default before `sampler: auto`
        "nogc": {"gradient_checkpointing": False},
        "teacher-per-step": {},  # the default, its teacher's shared prefix run every step (before FrozenPrefixes)
        "bf16": {},  # the default on a model whose weights are bfloat16 (`opcd.trainer.weights_dtype: bfloat16`)
    }[variant]
    config = OPCDConfig(
        lr=args.lr,
        k=256,
        temperature=0.7,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        lora_r=16,
        lora_alpha=32,
        seed=0,
        **options,
    )
    torch.manual_seed(0)  # the adapter's initialisation, so that every run of a variant trains on the same samples
    trainer = OPCDTrainer(model, tok, config)
    if variant == "teacher-per-step":
        trainer._teacher_prefixes = None
    history = trainer.train(_chats(args.batch_size * (args.steps + 1)), LESSONS, steps=args.steps + 1)
    timed = history[1:]
    seconds = sum(m["seconds"] for m in timed)
    return {
        "tokens_per_s": sum(m["tokens"] for m in timed) / seconds,
        "s_per_step": seconds / len(timed),
        "sample_frac": sum(m["sample_seconds"] for m in timed) / seconds,
        "teacher_frac": sum(m["teacher_seconds"] for m in timed) / seconds,
        "peak_mib": _peak_mib(),
        "over_model_mib": _peak_mib() - loaded,
        "tokens_per_step": sum(m["tokens"] for m in timed) / len(timed),
    }


def run_trl(model_name: str, args, *, gradient_checkpointing: bool = True, bf16: bool = False) -> dict:
    import warnings

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    warnings.filterwarnings("ignore")
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl.experimental.sdft import SDFTConfig, SDFTTrainer

    model, tok = _load(model_name, "bfloat16" if bf16 else "float32")
    loaded = _rss_mib()
    data = Dataset.from_list(
        [{"prompt": chat, "privileged_context": LESSONS} for chat in _chats(args.batch_size * (args.steps + 1))]
    )
    stamps: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            stamps.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    with tempfile.TemporaryDirectory() as out:
        config = SDFTConfig(
            output_dir=out,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            num_generations=1,
            max_steps=args.steps + 1,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            max_grad_norm=1.0,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=bf16,
            temperature=0.7,
            top_k=0,
            top_p=1.0,
            max_completion_length=args.max_new_tokens,
            distillation_mode="topk_logits",
            distillation_topk=256,
            distillation_alpha=1.0,
            distillation_is_clip=None,
            teacher_model_kind="base",
            shuffle_dataset=False,
            seed=0,
            teacher_prompt_template="{privileged_context}\n\n{prompt}",
            disable_tqdm=True,
            gradient_checkpointing=gradient_checkpointing,
        )
        lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
        trainer = SDFTTrainer(
            model=model, args=config, train_dataset=data, processing_class=tok, peft_config=lora, callbacks=[Clock()]
        )
        trainer.train()
    durations = [end - start for start, end in zip(stamps[0::2], stamps[1::2])][1:]
    tokens = [length * args.batch_size for length in lengths][1:]
    seconds = sum(durations)
    return {
        "tokens_per_s": sum(tokens) / seconds,
        "s_per_step": seconds / len(durations),
        "sample_frac": float("nan"),
        "teacher_frac": float("nan"),
        "peak_mib": _peak_mib(),
        "over_model_mib": _peak_mib() - loaded,
        "tokens_per_step": sum(tokens) / len(tokens),
    }


def _child(spec: str, args) -> None:
    import torch

    torch.set_num_threads(int(args.threads))
    model_name, runner = spec.split(":")
    if runner.startswith("trl"):
        result = run_trl(model_name, args, gradient_checkpointing=runner != "trl-nogc", bf16=runner == "trl-bf16")
    else:
        result = run_opcd(model_name, runner, args)
    result["load"] = os.getloadavg()[0]  # other processes on the machine skew the timings: say how busy it was
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--variants", default="plain,merged-fp32,default,trl")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (one more warm-up step runs first)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-6)
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts, each a block of rows")
    parser.add_argument("--repeat", type=int, default=1, help="runs per variant, interleaved; the fastest is shown")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args)
        return
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        import trl.experimental.sdft

        have_trl = True
    except ImportError as error:
        have_trl, why = False, str(error)
    print(
        f"OPCD vs TRL SDFTTrainer: batch {args.batch_size}, {args.max_new_tokens} new tokens max, "
        f"{args.steps} timed steps after 1 warm-up, threads {args.threads}, context {len(LESSONS)} chars\n"
    )
    print(
        "| model | threads | trainer | tokens/s | s/step | sampling | teacher | tokens/step | peak RSS MiB "
        "| over model MiB | load avg | tokens/s vs TRL | per step vs TRL |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    variants = args.variants.split(",")
    for model_name in args.models.split(","):
        for threads in args.threads.split(","):
            runs: dict[str, list[dict]] = {}
            for _ in range(args.repeat):  # interleaved, so that a burst of load elsewhere hits every variant alike
                for variant in variants:
                    if variant.startswith("trl") and not have_trl:
                        continue
                    runs.setdefault(variant, []).append(_run_child(model_name, variant, threads, args))
            best = {
                variant: max(good, key=lambda run: run["tokens_per_s"])  # the least disturbed run
                for variant, rows in runs.items()
                if (good := [r for r in rows if "error" not in r])
            }
            for variant in variants:  # each against TRL with the same gradient checkpointing, where it ran
                twin = {"nogc": "trl-nogc", "bf16": "trl-bf16"}.get(variant.rsplit("-", 1)[-1])
                trl = best.get(twin if twin in best else "trl")
                label = {
                    "trl": "TRL SDFTTrainer 1.16",
                    "trl-nogc": "TRL SDFTTrainer 1.16, no grad. checkpointing",
                    "trl-bf16": "TRL SDFTTrainer 1.16, bfloat16 weights",
                }.get(variant, f"OPCD {variant}")
                head = f"| {model_name} | {threads} | {label} |"
                if variant.startswith("trl") and not have_trl:
                    print(f"{head} TRL not installed ({why}); `pip install -e .[bench]` | | | | | | | | | |")
                    continue
                if variant not in best:
                    print(f"{head} failed: {runs[variant][-1]['error']} | | | | | | | | | |")
                    continue
                r = best[variant]
                good = [g for g in runs[variant] if "error" not in g]
                peak, over = max(g["peak_mib"] for g in good), max(g["over_model_mib"] for g in good)
                pct = lambda x: "-" if math.isnan(x) else f"{100 * x:.0f}%"
                versus = (
                    f"{r['tokens_per_s'] / trl['tokens_per_s']:.2f}x | {trl['s_per_step'] / r['s_per_step']:.2f}x"
                    if trl
                    else "- | -"
                )
                print(
                    f"{head} {r['tokens_per_s']:.1f} | {r['s_per_step']:.2f} | {pct(r['sample_frac'])} | "
                    f"{pct(r['teacher_frac'])} | {r['tokens_per_step']:.0f} | {peak:.0f} | {over:.0f} | "
                    f"{r['load']:.1f} | {versus} |",
                    flush=True,
                )


def _run_child(model_name: str, variant: str, threads: str, args) -> dict:
    """One configuration in its own process (its peak RSS is its own): the result, or {"error": [last line]}."""
    child = [
        sys.executable,
        __file__,
        "--child",
        f"{model_name}:{variant}",
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--lr",
        str(args.lr),
        "--threads",
        threads,
    ]
    proc = subprocess.run(child, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(lines[-1][len("RESULT ") :])


if __name__ == "__main__":
    main()
