"""OPCD training data parallel: the same cycle-sized job with 1, 2, ... ranks (`opcd.trainer.processes`).

Runs `distill.opcd.run_job` on SmolLM2-135M-Instruct (or the tiny model) with a fixed global batch, and prints
a markdown table: wall seconds of the whole job (process start, model load, KL before and after, training,
adapter write), seconds per optimizer step (warm-up step excluded) and training tokens/s. On a CPU machine
the ranks share the same cores (each gets cores / ranks threads), so this measures the overhead of data
parallelism (gloo all-reduce of the LoRA gradients, one model copy per rank) rather than a speed-up; on a
multi-GPU node each rank has its own GPU.

    .venv/bin/python bench/opcd_dp.py                     # smollm2, 1 and 2 ranks
    .venv/bin/python bench/opcd_dp.py --model tiny --processes 1,2 --steps 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LESSONS = "Lessons from past attempts:\n- Add the loose items after multiplying the boxes by their size."
SYSTEM = "You are a careful assistant. Solve the problem and give the final answer as \\boxed{N}."


def _model_path(name: str, folder: Path) -> str:
    if name == "tiny":
        from agent_runtime.testing import save_tiny_model

        return str(save_tiny_model(folder / "tiny"))
    from agent_runtime.checkpoints import resolve_model

    return resolve_model("smollm2-135m-instruct")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (one warm-up step runs first)")
    parser.add_argument("--batch-size", type=int, default=8, help="global prompts per step")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()

    from distill.opcd import OPCDConfig, TrainJob, run_job

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model_path = _model_path(args.model, folder)
        prompts = [
            [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": f"A shop sells {a} boxes of {a + 3} pencils and {2 * a} loose "
                    "pencils. How many pencils is that?",
                },
            ]
            for a in range(2, 2 + args.batch_size * (args.steps + 1))
        ]
        for processes in [int(p) for p in args.processes.split(",")]:
            config = OPCDConfig(
                steps=args.steps + 1,
                batch_size=args.batch_size,
                max_new_tokens=args.max_new_tokens,
                lr=1e-4,
                lora_r=16,
                processes=processes,
                seed=0,
            )
            job = TrainJob(
                model_path=model_path,
                config=config,
                train_prompts=prompts,
                contexts=LESSONS,
                output=str(folder / f"adapter-{processes}"),
                kl_sets={"heldout": (prompts[:4], LESSONS)},
            )
            started = time.perf_counter()
            result = run_job(job)
            wall = time.perf_counter() - started
            timed = result.steps[1:]
            seconds = sum(m["seconds"] for m in timed)
            rows.append(
                (
                    processes,
                    wall,
                    seconds / len(timed),
                    sum(m["tokens"] for m in timed) / seconds,
                    result.kl_before["heldout"],
                    result.kl_after["heldout"],
                )
            )
            print(f"processes={processes}: {wall:.1f} s", file=sys.stderr, flush=True)
    print(f"\nOPCD data parallel, {args.model}, global batch {args.batch_size}, {args.max_new_tokens} new tokens\n")
    print("| ranks | job wall s | s/step | train tokens/s | vs 1 rank | held-out KL before -> after |")
    print("|---:|---:|---:|---:|---:|---|")
    base = next((r[3] for r in rows if r[0] == 1), rows[0][3])
    for processes, wall, per_step, tps, before, after in rows:
        print(
            f"| {processes} | {wall:.1f} | {per_step:.2f} | {tps:.1f} | {tps / base:.2f}x "
            f"| {before:.3f} -> {after:.3f} |"
        )


if __name__ == "__main__":
    main()
