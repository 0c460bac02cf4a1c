"""Where the learning loop's time goes, phase by phase, against the floor of the same work on this machine.

Runs a config's agent loop (default: the quickstart, the README's `make run`) in a fresh workdir with its
profile on (`agent_runtime.state.profile`): wall and CPU seconds per phase, the games it generated, and the tokens
each phase put through the model (forward only for acting and the frozen teacher; forward + backward for the
student's training; forward only for the student's held-out KL). Then, in a fresh process, the *floor*: a plain
batched forward of the run's mean prompt length through the same model (8 rows, no_grad), and a training step's
forward + backward with the run's LoRA and gradient checkpointing settings, as tokens per second; a phase's floor
is its forward tokens at the first rate plus its training tokens at the second. (Measured in the run's own process
after it, the training rate came out 27-42% lower on an AMD EPYC: the runtime maps large allocations on their own,
`bound_heap`, and a plain step's 8 x 256 tokens then page-fault ~6x as often; the loop's own smaller micro-batches
ran as fast either way.) The ratio wall / floor says how far a phase is from what the hardware does with the same
tokens (game generation, which is not model work, is shown apart and left out of the ratio). "prefilled" is the part of
the acting prompts that went through the model at all: what the backend's prefix KV store (and a prefix shared by
a call's rows) left to run.

Memory (the second table): each phase's peak resident set (the kernel's high-water mark, reset at every phase
boundary) and what held it. A sampler thread reads the resident set every `--sample-s` seconds; whenever a phase
reaches a new high it takes an inventory of the live objects: the distinct sets of model weights (counted by
their embedding matrices, so a LoRA-wrapped model and its base are one), gradients, optimizer state, the acting
backend's prefix KV cache, every other live tensor, and the rest (the interpreter, libraries, allocator). The
floor beside it is what the phase cannot do without: the process with its imports (measured before the run), the
model's weights once, and for CONSOLIDATE the LoRA optimizer's state and gradients and one micro-batch's kept
activations (measured in a fresh process with the runtime's allocator settings: a forward + backward of
`opcd.trainer.micro_batch_tokens` tokens with the run's gradient checkpointing setting, the largest forward the
trainer runs).

    .venv/bin/python bench/loop.py                                   # the quickstart, ~10 min on 2 cores
    .venv/bin/python bench/loop.py --set runtime.episodes=16 --set opcd.consolidate_every=16
    .venv/bin/python bench/loop.py --config configs/smoke.yaml

Prints the table (markdown) and writes it, with the raw numbers, to `<workdir>/profile.json`.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import threading
import time
import warnings
import weakref
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


def floor_rates(model_name: str, length: int, lora: dict, part: str, rows: int = 8, repeats: int = 3) -> dict:
    """One part of the floor, in a process of its own (`floor_in_fresh_process`): the floor is what the machine does
    with the tokens, not what a long run's process state (its allocator settings, its heap) lets it do.

    `time`: tokens per second of a plain batched forward (no_grad) and of a training step's forward + backward
    through a LoRA student, `rows` x `length` tokens, float32, this process's torch threads (the best of
    `repeats`), with glibc's own allocator settings. The training step is the one the choice objective runs: the
    decoder over every token, the head over the scored positions only (a tenth here), with the run's gradient
    checkpointing setting (`lora["gradient_checkpointing"]`, the trainer's default on: one more forward, recomputed
    in the backward pass).
    `memory`: the weights, and what one training micro-batch of the trainer's token cap adds (its kept activations,
    the gradients and the optimizer's state), with the runtime's allocator settings (`bound_heap`) from the start,
    as the loop runs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agent_runtime.checkpoints import resolve_model
    from agent_runtime.state.profile import memory_mb, reset_peak
    from distill.opcd.policies import enable_checkpointing
    from modelkit.weights import bound_heap, release_memory

    if part == "memory":
        bound_heap()
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

    weights_mb = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())) / 2**20
    forward = None
    if part == "time":
        with torch.no_grad():
            forward = best(lambda: model(input_ids=ids))
    student = get_peft_model(
        model,
        LoraConfig(
            r=lora.get("lora_r", 8),
            lora_alpha=lora.get("lora_alpha", 16),
            target_modules=lora.get("lora_target_modules") or "all-linear",
        ),
    )
    student.train()
    optimizer = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-4)
    checkpointed = bool(lora.get("gradient_checkpointing", True))
    if checkpointed:
        enable_checkpointing(student.get_base_model())
    decoder, head = student.get_base_model().model, student.get_base_model().lm_head

    def step(tokens) -> None:
        hidden = decoder(input_ids=tokens).last_hidden_state[:, ::10]
        head(hidden).float().logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if part == "time":
        train = best(lambda: step(ids))
        return {"forward": forward, "train": train, "checkpointed": checkpointed, "rows": rows, "length": ids.shape[1]}
    cap = torch.randint(0, model.config.vocab_size, (1, lora.get("micro_batch_tokens", 512)))
    step(cap)  # the optimizer's state exists from here on, as in a cycle
    release_memory()
    before = memory_mb().get("VmRSS", 0.0)
    reset_peak()
    step(cap)
    return {"weights_mb": weights_mb, "train_mb": memory_mb().get("VmHWM", 0.0) - before + optimizer_mb(optimizer)}


def floor_in_fresh_process(model_name: str, length: int, lora: dict) -> dict:
    """`floor_rates`' two parts, each in a new interpreter (this script with `--floor`), with this process's
    environment (its torch threads)."""
    import subprocess

    out: dict = {}
    for part in ("time", "memory"):
        spec = json.dumps({"model": model_name, "length": length, "lora": lora, "part": part})
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--floor", spec],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"measuring the floor ({part}) failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
            )
        out.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def optimizer_mb(optimizer) -> float:
    import torch

    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return sum(t.numel() * t.element_size() for t in [*state, *params]) / 2**20  # + the gradients, as large


def holdings() -> dict[str, float]:
    """What the live objects hold now, in MB: the memory's sentence embedder (once loaded), model weights (and how
    many distinct sets besides the embedder), gradients, optimizer state, prefix KV caches, other tensors.
    Tensors are counted once per storage."""
    import torch

    from agent_runtime.llm.prefix_cache import PrefixCache
    from memory.embeddings import SentenceTransformerEmbedder

    seen: set[int] = set()

    def mb(tensors) -> float:
        total = 0
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key and key not in seen:
                seen.add(key)
                total += storage.nbytes()
        return total / 2**20

    with warnings.catch_warnings():  # isinstance on deprecated module attributes (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        # a weak proxy whose object is gone raises on isinstance: leave proxies out (they hold nothing)
        objects = [o for o in gc.get_objects() if not isinstance(o, weakref.ProxyTypes)]
        modules = [o for o in objects if isinstance(o, torch.nn.Module)]
        optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
        caches = [o for o in objects if isinstance(o, PrefixCache)]
        tensors = [o for o in objects if isinstance(o, torch.Tensor)]
        embedders = [o.module for o in objects if isinstance(o, SentenceTransformerEmbedder) and o.module is not None]
    del objects
    out: dict[str, float] = {"embedder": mb(t for e in embedders for t in (*e.parameters(), *e.buffers()))}
    embeddings = set()
    for module in modules:
        get = getattr(module, "get_input_embeddings", None)
        try:
            weight = get().weight if callable(get) else None
        except (AttributeError, NotImplementedError):  # a module without embeddings is not a model copy
            weight = None
        if isinstance(weight, torch.Tensor) and weight.untyped_storage().data_ptr() not in seen:  # not the embedder
            embeddings.add(weight.untyped_storage().data_ptr())
    out["model copies"] = float(len(embeddings))
    out["optimizer"] = mb(t for o in optimizers for state in o.state.values() for t in state.values())
    params = [p for m in modules for p in m.parameters(recurse=False)]
    out["gradients"] = mb(p.grad for p in params if p.grad is not None)
    out["weights"] = mb([*params, *(b for m in modules for b in m.buffers(recurse=False))])
    out["prefix cache"] = mb(t for o in caches for entry in o.entries.values() for t in (*entry.keys, *entry.values))
    out["other tensors"] = mb(tensors)
    return out


class MemorySampler(threading.Thread):
    """Reads the resident set every `every` s; at each new high of the open phase, records `holdings()` there."""

    def __init__(self, profile, every: float = 1.0, margin_mb: float = 64.0):
        super().__init__(daemon=True)
        self.profile, self.every, self.margin = profile, every, margin_mb
        self.at_peak: dict[str, dict] = {}  # phase -> {"rss_mb": ..., **holdings}
        self.done = threading.Event()

    def run(self) -> None:
        from agent_runtime.state.profile import memory_mb

        while not self.done.wait(self.every):
            open_rows = self.profile.open_phases()
            if not open_rows:
                continue
            rss = memory_mb().get("VmRSS", 0.0)
            for name in open_rows:
                best = self.at_peak.get(name, {}).get("rss_mb", 0.0)
                if rss > best + self.margin or name not in self.at_peak:
                    self.at_peak[name] = {"rss_mb": rss, **holdings()}


def ordered(profile: dict[str, dict]) -> list[tuple[str, dict]]:
    """The profile's rows, the loop's phases first in their order, then any other part."""
    return [(n, profile[n]) for n in [*ROWS, *(n for n in profile if n not in ROWS)] if n in profile]


def memory_table(profile: dict[str, dict], at_peak: dict[str, dict], floors: dict[str, float]) -> str:
    lines = [
        (
            f"floor: the process with its imports {floors['base']:.0f} MB + the weights once {floors['weights']:.0f} "
            f"MB; training adds {floors['train']:.0f} MB (the LoRA optimizer's state and gradients + one "
            "micro-batch's kept activations)"
        ),
        "",
        (
            "| phase | peak MB | end MB | floor MB | peak / floor | at the sampled high: RSS MB | model copies "
            "| weights | embedder | grads + optimizer | prefix cache | other tensors | rest |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in ordered(profile):
        if not row.get("peak_rss_mb"):
            continue
        floor = floors["base"] + (floors["weights"] if name != "START" else 0)
        if name.startswith("CONSOLIDATE"):
            floor += floors["train"]
        held = at_peak.get(name)
        if held:
            tensors = held["weights"] + held["gradients"] + held["optimizer"] + held["prefix cache"]
            tensors += held["other tensors"] + held["embedder"]
            rest = held["rss_mb"] - tensors
            cells = (
                f"{held['rss_mb']:.0f} | {held['model copies']:.0f} | {held['weights']:.0f} | "
                f"{held['embedder']:.0f} | "
                f"{held['gradients'] + held['optimizer']:.0f} | {held['prefix cache']:.0f} | "
                f"{held['other tensors']:.0f} | {rest:.0f}"
            )
        else:
            cells = "- | - | - | - | - | - | - | -"
        lines.append(
            f"| {name} | {row['peak_rss_mb']:.0f} | {row['end_rss_mb']:.0f} | {floor:.0f} | "
            f"{row['peak_rss_mb'] / floor:.1f}x | {cells} |"
        )
    return "\n".join(lines) + "\n"


def table(profile: dict[str, dict], rates: dict[str, float], seconds: float) -> str:
    lines = [
        (
            f"floor: forward {rates['forward']:,.0f} tok/s, forward+backward (LoRA"
            f"{', checkpointed' if rates.get('checkpointed') else ''}) {rates['train']:,.0f} tok/s "
            f"({rates['rows']} x {rates['length']} tokens, float32, a fresh process); run wall {seconds:.0f} s"
        ),
        "",
        (
            "| phase | wall s | CPU s | games generated (s) | forward tokens | prefilled | train tokens | decisions "
            "| floor s | wall / floor |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in ordered(profile):
        floor = row["forward_tokens"] / rates["forward"] + row["train_tokens"] / rates["train"]
        model_wall = row["wall_s"] - row["games_s"]
        ratio = f"{model_wall / floor:.1f}x" if floor > 0.01 else "-"
        lines.append(
            f"| {name} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | {row['games']} ({row['games_s']:.1f}) | "
            f"{row['forward_tokens']:,} | {row['prefilled_tokens']:,} | {row['train_tokens']:,} | "
            f"{row['decisions']:,} | "
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
    parser.add_argument("--sample-s", type=float, default=1.0, help="how often the memory sampler reads (seconds)")
    parser.add_argument("--floor", default=None, help=argparse.SUPPRESS)  # the floor alone, as JSON (a fresh process)
    args = parser.parse_args(argv)
    if args.floor is not None:
        spec = json.loads(args.floor)
        print(json.dumps(floor_rates(spec["model"], spec["length"], spec["lora"], spec["part"])))
        return 0

    import torch  # noqa: F401 - the floor's "process with its imports" includes the libraries every run loads
    import transformers  # noqa: F401

    from agent_runtime.config import load_config
    from agent_runtime.run.loop import AgentLoop
    from agent_runtime.state.profile import memory_mb

    config = load_config(args.config, args.set)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="loop-profile-"))
    gc.collect()
    base_mb = memory_mb().get("VmRSS", 0.0)
    started = time.perf_counter()
    loop = AgentLoop(config, workdir, progress=not args.no_progress)
    sampler = MemorySampler(loop.profile, every=args.sample_s)
    sampler.start()
    try:
        loop.run()
    finally:
        sampler.done.set()
        loop.close()
    seconds = time.perf_counter() - started
    profile = loop.profile.as_dict()
    play = profile.get("PLAY", {})
    length = round(play.get("prompt_tokens", 0) / play["decisions"]) if play.get("decisions") else 256
    from agent_runtime.llm import LOCAL_WEIGHTS

    floor_model = args.floor_model or (
        config.model.name if config.model.backend in LOCAL_WEIGHTS else "smollm2-135m-instruct"
    )
    rates = floor_in_fresh_process(floor_model, length, config.opcd.trainer.model_dump(mode="json"))
    local = config.model.backend in LOCAL_WEIGHTS  # a scripted or remote model holds no weights here
    floors = {
        "base": base_mb,
        "weights": rates["weights_mb"] if local else 0.0,
        "train": rates["train_mb"] if local and config.opcd.enabled else 0.0,
    }
    text = table(profile, rates, seconds) + "\n" + memory_table(profile, sampler.at_peak, floors)
    print(text)
    (workdir / "profile.json").write_text(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.set,
                "seconds": seconds,
                "rates": rates,
                "profile": profile,
                "memory_floors": floors,
                "at_peak": sampler.at_peak,
                "table": text,
            },
            indent=1,
        )
    )
    print(f"(written to {workdir / 'profile.json'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
