"""Where the learning loop's time goes, phase by phase, against the floor of the same work on this machine.

Runs a config's agent loop (default: the quickstart, the README's `make run`) in a fresh workdir with its
profile on (`agent_runtime.run.profile`): wall and CPU seconds per phase, the games it generated, and the tokens
each phase put through the model (forward only for acting and the frozen teacher; forward + backward for the
student's training). Then, in the same process, the *floor*: a plain batched forward of the run's mean prompt
length through the same model (8 rows, no_grad), and a forward + backward with the run's LoRA settings, as
tokens per second; a phase's floor is its forward tokens at the first rate plus its training tokens at the
second. The ratio wall / floor says how far a phase is from what the hardware does with the same tokens
(game generation, which is not model work, is shown apart and left out of the ratio).

    .venv/bin/python bench/loop.py                                   # the quickstart, ~10 min on 2 cores
    .venv/bin/python bench/loop.py --set runtime.episodes=16 --set opcd.consolidate_every=16
    .venv/bin/python bench/loop.py --config configs/smoke.yaml

Prints the table (markdown) and writes it, with the raw numbers, to `<workdir>/profile.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = (
    "START",
    "START: model",
    "PLAY",
    "EXTRACT",
    "CONSOLIDATE",
    "CONSOLIDATE: train",
    "CONSOLIDATE: evaluate",
    "PROMOTE: probe",
)


def floor_rates(model_name: str, length: int, lora: dict, rows: int = 8, repeats: int = 3) -> dict[str, float]:
    """Tokens per second of a plain batched forward (no_grad) and of forward + backward through a LoRA student,
    `rows` x `length` tokens, float32, this process's torch threads (the best of `repeats`)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agent_runtime.checkpoints import resolve_model

    path = resolve_model(model_name)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (rows, max(8, length)), generator=torch.Generator().manual_seed(0))

    def best(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return ids.numel() / min(times)

    with torch.no_grad():
        forward = best(lambda: model(input_ids=ids))
    student = get_peft_model(
        model,
        LoraConfig(
            r=lora.get("lora_r", 8),
            lora_alpha=lora.get("lora_alpha", 16),
            target_modules=lora.get("target_modules") or "all-linear",
        ),
    )
    student.train()

    def step() -> None:
        student(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
        student.zero_grad(set_to_none=True)

    return {"forward": forward, "train": best(step), "rows": rows, "length": ids.shape[1]}


def table(profile: dict[str, dict], rates: dict[str, float], seconds: float) -> str:
    lines = [
        (
            f"floor: forward {rates['forward']:,.0f} tok/s, forward+backward (LoRA) {rates['train']:,.0f} tok/s "
            f"({rates['rows']} x {rates['length']} tokens, float32); run wall {seconds:.0f} s"
        ),
        "",
        (
            "| phase | wall s | CPU s | games generated (s) | forward tokens | train tokens | decisions | floor s "
            "| wall / floor |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in [*ROWS, *(n for n in profile if n not in ROWS)]:
        row = profile.get(name)
        if row is None:
            continue
        floor = row["forward_tokens"] / rates["forward"] + row["train_tokens"] / rates["train"]
        model_wall = row["wall_s"] - row["games_s"]
        ratio = f"{model_wall / floor:.1f}x" if floor > 0.01 else "-"
        lines.append(
            f"| {name} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | {row['games']} ({row['games_s']:.1f}) | "
            f"{row['forward_tokens']:,} | {row['train_tokens']:,} | {row['decisions']:,} | "
            f"{floor:.1f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    parser.add_argument(
        "--floor-model",
        default=None,
        help="the model the floor is measured on (default: the run's, or SmolLM2 for a scripted run)",
    )
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    from agent_runtime.config import load_config
    from agent_runtime.run.loop import AgentLoop

    config = load_config(args.config, args.set)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="loop-profile-"))
    started = time.perf_counter()
    loop = AgentLoop(config, workdir, progress=not args.no_progress)
    try:
        loop.run()
    finally:
        loop.close()
    seconds = time.perf_counter() - started
    profile = loop.profile.as_dict()
    play = profile.get("PLAY", {})
    length = round(play.get("prompt_tokens", 0) / play["decisions"]) if play.get("decisions") else 256
    from agent_runtime.llm import LOCAL_WEIGHTS

    floor_model = args.floor_model or (
        config.model.name if config.model.backend in LOCAL_WEIGHTS else "smollm2-135m-instruct"
    )
    rates = floor_rates(floor_model, length, config.opcd.trainer.model_dump())
    text = table(profile, rates, seconds)
    print(text)
    (workdir / "profile.json").write_text(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.set,
                "seconds": seconds,
                "rates": rates,
                "profile": profile,
                "table": text,
            },
            indent=1,
        )
    )
    print(f"(written to {workdir / 'profile.json'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
