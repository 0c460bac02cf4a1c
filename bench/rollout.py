"""Rollout throughput of the episode runner: episodes/min and generated tokens/s for 1, 4, 8 and 16 slots.

The runner steps N environment slots together and sends every live slot's prompt to one batched `backend.generate` per
turn; this measures what that batching buys on CPU. Setting = (model, slots); each setting plays the same fixed draws
(max(`--episodes`, slots) of them; draw k is the same task and seed everywhere) of TextWorld coin_collector level 1 from
a small task pool whose games are generated once, before any timing, under `~/.cache/agent-runtime/bench-games`
(`--games-dir` moves it). Models: `tiny` (the random tiny Llama of `agent_runtime.testing`) and `smollm2`
(SmolLM2-135M-Instruct, `resolve_model("smollm2-135m-instruct")`), both with the transformers backend on CPU, 32 new
tokens, greedy by default (`--temperature 0`): with sampling, a reply depends on the batch it was drawn in, so each slot
count would play different episodes and the totals would move by ~10%; greedy makes the rows compare the same episodes
(bf16 batch numerics can still end a reply a token earlier: compare the generated tokens/s column too). `EpisodeRunner`
is driven directly; finished episodes are only counted (no SQL writes are timed).

Besides the rates, each row says where the wall time went, measured by thin timing wrappers
(bench/rollout_timing.py; nothing in the runtime is changed): `model.generate` (the decode loop, prefill
included), the rest of `backend.generate` (chat-template rendering, tokenization, padding, decoding text), prompt
building (`PromptBuilder.build`, which renders and tokenizes the chat again to fit the context window), and the
environments (`reset` + `step`). "pad" is the share of the prompt batch that was left padding.

`--backend vllm` runs the same settings on the vllm backend (SmolLM2 only): vLLM's CPU build in its own
environment (`bash .ci/vllm-env.sh`; `--vllm-python` overrides), the engine in a child process as
`model.options.python` runs it, with vLLM's own prefix cache and continuous batching. Its rows have no
`model.generate` split (the engine is a black box: its time is "backend"), "prefilled" is the share of prompt
tokens vLLM did not find in its prefix cache, and CPU time includes the engine's processes.

`--lessons N` puts N lesson lines into the system prompt (about 25 tokens each), as a learning run does;
`--no-prefix-cache` turns off the backend's prefix KV cache, to compare, and `--prefix-cache-tokens 0` keeps
only its within-call part (a prefix shared by the rows of one call, run once) and stores nothing across
turns. With the cache on, a shared prefix's one forward pass is not a `model.generate` call, so it counts as
backend overhead; "prefilled" is the share of the prompt tokens that went through the model (the rest came
from the cache).

What to read in it: on CPU a decode step is memory-bound (batch 8 costs about twice batch 1), but the
prompt's prefill is compute-bound and grows linearly with the number of rows, so the prefill share of the
wall time (in brackets) is what caps the speedup of more slots.

    .venv/bin/python bench/rollout.py                        # tiny + smollm2, slots 1,4,8,16
    .venv/bin/python bench/rollout.py --models tiny --slots 1,8 --episodes 32
    .venv/bin/python bench/rollout.py --models smollm2 --slots 1,8 --lessons 20 --no-prefix-cache
    .venv/bin/python bench/rollout.py --profile smollm2:8    # cProfile of one setting, top functions
    .venv/bin/python bench/rollout.py --models smollm2 --backend vllm --dtype bfloat16 --slots 1,8
    .venv/bin/python bench/rollout.py --quick                # seconds; what tests/bench/test_bench_smoke.py runs
    .venv/bin/python bench/rollout.py --models smollm2 --slots 8 --action-mode choice --level 2 --lessons 8 \
        --choice-batch-mb 1000,64 --repeat 3                  # a call's rows in one forward or in groups, interleaved

The machine's load average is printed with the table: on a shared 2-core box, wall-clock numbers taken
while other processes compete for the cores are not comparable with quiet ones. The "CPU time" speedup
(episodes per CPU-second of this process) is much less sensitive to that; with `--threads 1` it is what
the wall-clock speedup would be on an otherwise idle core.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch

import environments
from agent_runtime.episode.prompt import PromptBuilder
from agent_runtime.episode.runner import EnvSlotSpec, EpisodeRunner, TaskSampler
from agent_runtime.llm.base import SamplingParams
from agent_runtime.llm.transformers_backend import TransformersBackend
from agent_runtime.state.profile import memory_mb, reset_peak
from bench.rollout_timing import TimedBackend, TimedBuilder, TimedEnv, Timers, cpu_seconds
from modelkit.weights import release_memory

ENV_ID = "textworld/coin_collector"
MODELS = ("tiny", "smollm2")


def load_backend(
    model: str,
    dtype: str = "auto",
    prefix_cache: bool = True,
    prefix_cache_tokens: int | None = None,
    backend: str = "transformers",
    vllm_python: str | None = None,
) -> TransformersBackend:
    if backend == "vllm":
        return load_vllm_backend(model, dtype, prefix_cache, vllm_python)
    options = {"device": "cpu", "dtype": dtype, "prefix_cache": prefix_cache}
    if prefix_cache_tokens is not None:
        options["prefix_cache_tokens"] = prefix_cache_tokens
    if model == "tiny":
        from agent_runtime.testing import tiny_model_and_tokenizer

        net, tokenizer = tiny_model_and_tokenizer()
        return TransformersBackend(net, tokenizer, **options)
    if model == "smollm2":
        from agent_runtime.checkpoints import resolve_model

        return TransformersBackend.from_pretrained(resolve_model("smollm2-135m-instruct"), **options)
    raise SystemExit(f"unknown model {model!r}; accepted: {', '.join(MODELS)}")


def load_vllm_backend(model: str, dtype: str, prefix_cache: bool, python: str | None):
    """SmolLM2 on the vllm backend, in vLLM's own environment (what `model.options.python` starts)."""
    from agent_runtime.checkpoints import resolve_model
    from agent_runtime.llm.vllm_process import VLLMProcessBackend

    if model != "smollm2":
        raise SystemExit("--backend vllm runs the smollm2 model only (the tiny model's tokenizer is built in code)")
    python = (
        python
        or subprocess.run(
            ["bash", str(ROOT / ".ci" / "vllm-env.sh"), "--find"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    if not python:
        raise SystemExit(
            "--backend vllm: vLLM's CPU environment is not built; run `bash .ci/vllm-env.sh` (or pass --vllm-python)"
        )
    backend = VLLMProcessBackend(
        resolve_model("smollm2-135m-instruct"),
        python=python,
        dtype=dtype,
        context_window=4096,
        enable_prefix_caching=prefix_cache,
    )
    print(f"  vllm engine ({backend.platform}, {backend.dtype}) up in {backend.start_seconds:.0f}s", file=sys.stderr)
    return backend


def env_kwargs(args) -> dict:
    return {"level": args.level, "n_train": args.tasks, "cache_dir": str(args.games_dir)}


def pregenerate(args) -> float:
    """Generate (or find cached) every game of the task pool; return the seconds it took."""
    start = time.perf_counter()
    env = environments.make(ENV_ID, **env_kwargs(args))
    try:
        for task in env.tasks("train"):
            env.game_file(task)
    finally:
        env.close()
    return time.perf_counter() - start


def run_setting(backend: TransformersBackend, model: str, slots: int, args) -> dict:
    """Play max(`args.episodes`, slots) draws with `slots` slots (every slot plays); return the row."""
    timers = Timers()
    timed = TimedBackend(backend, timers)
    kwargs = env_kwargs(args)
    spec = EnvSlotSpec(ENV_ID, lambda: TimedEnv(environments.make(ENV_ID, **kwargs), timers), "text", args.max_steps)
    builder = PromptBuilder(
        family="text",
        count_tokens=timed.count_tokens,
        context_window=timed.context_window,
        reserve_tokens=args.max_new_tokens,
        lessons=bench_lessons(args.lessons),
        history_shows_admissible=args.history_admissible,
        action_mode=args.action_mode,
    )
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    runner = EpisodeRunner(timed, [spec], [TimedBuilder(builder, timers)], params, slots=slots, policy_name=model)
    sampler = TaskSampler([1.0], [[f"train-{i}" for i in range(args.tasks)]], seed=args.seed)
    draws = iter(range(max(args.episodes, slots)))
    episodes = []
    backend.clear_prefix_cache()  # every setting starts cold
    prompt_before, prefilled_before = backend.prefix_stats.prompt_tokens, backend.prefix_stats.prefilled_tokens
    scored_before = backend.prefix_stats.scored_tokens
    torch.manual_seed(args.seed)
    release_memory()
    reset_peak()
    start, cpu_start = time.perf_counter(), cpu_seconds(backend)
    try:
        runner.run(lambda: _next_draw(sampler, draws), episodes.append)
    finally:
        wall, cpu = time.perf_counter() - start, cpu_seconds(backend) - cpu_start
        runner.close()
        timed.restore()
    errors = [e.error for e in episodes if e.outcome == "error"]
    if errors:
        raise RuntimeError(f"{model} with {slots} slots: {len(errors)} episodes errored, first: {errors[0]}")
    tokens = sum(e.completion_tokens for e in episodes)
    steps = sum(len(e.steps) for e in episodes)
    other = wall - timers.backend_generate - timers.build - timers.env
    total_prompt = timers.prompt_tokens + timers.padded_tokens
    prompted = backend.prefix_stats.prompt_tokens - prompt_before
    prefilled = backend.prefix_stats.prefilled_tokens - prefilled_before
    scored = backend.prefix_stats.scored_tokens - scored_before
    long = [t for t in timers.episode_tokens if len(t) >= 3] if slots == 1 else []
    played = sorted((e.task_id, tuple(s.action for s in e.steps)) for e in episodes)
    return {
        "model": model,
        "backend": backend.name,
        "slots": slots,
        "episodes": len(episodes),
        "steps": steps,
        "won": sum(e.won for e in episodes),
        "wall_s": wall,
        "cpu_s": cpu,
        "episodes_per_min": 60 * len(episodes) / wall,
        "steps_per_s": steps / wall,
        "episodes_per_cpu_min": 60 * len(episodes) / cpu,
        "gen_tokens_per_s": tokens / wall,
        "mean_batch": sum(timers.batch_sizes) / max(1, len(timers.batch_sizes)),
        "share_model_generate": timers.model_generate / wall,
        "share_prefill": timers.prefill / wall,
        "share_backend_overhead": (timers.backend_generate - timers.model_generate) / wall,
        "share_prompt_build": timers.build / wall,
        "share_env": timers.env / wall,
        "share_other": other / wall,
        "pad_share": timers.padded_tokens / total_prompt if total_prompt else 0.0,
        "mean_prompt_tokens": (timers.prompt_tokens or prompted) / max(1, steps),  # vLLM: the engine's count
        "prefilled_share": prefilled / prompted if prompted else 0.0,
        # prompt tokens prefilled + (choice mode) action tokens scored, per decision; and over the decisions of
        # episodes of 3 or more turns (one slot only: there each call is one episode's decision)
        "computed_per_decision": (prefilled + scored) / max(1, steps),
        "computed_per_decision_3plus": sum(map(sum, long)) / sum(map(len, long)) if long else None,
        "episodes_3plus": len(long),
        "outcomes_sha": hashlib.sha256(repr(played).encode()).hexdigest()[:12],
        "choice_batch_mb": getattr(backend, "choice_batch_bytes", 0) / 2**20,
        "peak_rss_mb": memory_mb().get("VmHWM", 0.0),
    }


def bench_lessons(n: int) -> list[str]:
    """`n` distinct lesson lines of the kind the extractor writes (about 25 tokens each)."""
    things = ["coin", "door", "key", "chest", "lamp", "map", "box", "note"]
    rooms = ["kitchen", "cellar", "garden", "attic", "hall", "study", "pantry", "porch"]
    return [
        f"When you see the {things[i % 8]} in the {rooms[i // 8 % 8]}, check the admissible actions first "
        f"and prefer 'take {things[i % 8]}' over moving on (lesson {i + 1})."
        for i in range(n)
    ]


def _next_draw(sampler: TaskSampler, draws):
    index = next(draws, None)
    return None if index is None else sampler.draw(index)


def warm_up(backend: TransformersBackend, args) -> None:
    """One small batched call so that one-off costs (first matmul kernels, lazy imports) are not timed."""
    chat = [{"role": "user", "content": "You are in a kitchen. Admissible actions: go north | take coin"}]
    backend.generate([chat, chat], SamplingParams(max_new_tokens=4, temperature=args.temperature))
    if args.action_mode == "choice":
        backend.choose([chat, chat], [["go north", "take coin"]] * 2, SamplingParams(temperature=args.temperature))


def table(rows: list[dict]) -> str:
    base = {(r["model"], r.get("backend")): r for r in rows if r["slots"] == 1}
    lines = [
        (
            "| model | slots | episodes | steps | wall s | CPU s | episodes/min | gen tokens/s | speedup vs 1 slot "
            "| speedup, CPU time | mean batch | model.generate (prefill) | backend overhead | prompt build | env "
            "| other | prompt tokens | pad | prefilled | computed / decision | same, episodes of 3+ turns | outcomes "
            "| choice batch MB | peak MB |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        one = base.get((r["model"], r.get("backend")))
        engine = r.get("backend") == "vllm"  # no model.generate of ours to time: the engine's time is "backend"
        split = "-" if engine else f"{r['share_model_generate']:.0%} ({r['share_prefill']:.0%})"
        long = "-"
        if r.get("computed_per_decision_3plus") is not None:
            long = f"{r['computed_per_decision_3plus']:.0f} ({r['episodes_3plus']} episodes)"
        speedup = f"{r['episodes_per_min'] / one['episodes_per_min']:.2f}x" if one else "-"
        cpu_speedup = f"{r['episodes_per_cpu_min'] / one['episodes_per_cpu_min']:.2f}x" if one else "-"
        lines.append(
            f"| {r['model'] + (' (vllm)' if engine else '')} | {r['slots']} | {r['episodes']} | {r['steps']} "
            f"| {r['wall_s']:.1f} | {r['cpu_s']:.1f} "
            f"| {r['episodes_per_min']:.1f} | {r['gen_tokens_per_s']:.1f} | {speedup} | {cpu_speedup} "
            f"| {r['mean_batch']:.1f} "
            f"| {split} | {r['share_backend_overhead']:.0%} "
            f"| {r['share_prompt_build']:.0%} | {r['share_env']:.0%} | {r['share_other']:.0%} "
            f"| {r['mean_prompt_tokens']:.0f} | {r['pad_share']:.0%} | {r['prefilled_share']:.0%} "
            f"| {r['computed_per_decision']:.0f} | {long} | {r['outcomes_sha']} "
            f"| {r['choice_batch_mb']:g} | {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def profile_setting(backend: TransformersBackend, model: str, slots: int, args) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    row = run_setting(backend, model, slots, args)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("tottime")
    stats.print_stats(args.profile_top)
    return table([row]) + "\n\n```\n" + out.getvalue().strip() + "\n```"


def megabytes(text: str) -> list[float]:
    """`--choice-batch-mb`: positive numbers, comma-separated."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive numbers of MB separated by commas, e.g. 1000,64")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2", help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--slots", default="1,4,8,16", help="comma-separated slot counts")
    parser.add_argument(
        "--episodes",
        type=int,
        default=8,
        help="episodes per setting, at least one per slot (draw k is the same everywhere)",
    )
    parser.add_argument("--max-steps", type=int, default=4, help="step budget of an episode")
    parser.add_argument(
        "--level", type=int, default=1, help="coin_collector level (1: the coin in the room; 2: one room away)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 (default): greedy, so every slot count plays the same episodes and the rows compare "
        "equal work; sampled replies differ with the batch and move the totals by ~10%%",
    )
    parser.add_argument("--tasks", type=int, default=8, help="size of the coin_collector task pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="the backend's dtype (auto = float32 on CPU, the runtime's default)",
    )
    parser.add_argument(
        "--backend",
        choices=("transformers", "vllm"),
        default="transformers",
        help="vllm: SmolLM2 on vLLM's CPU build, in its own environment (bash .ci/vllm-env.sh)",
    )
    parser.add_argument(
        "--vllm-python", help="the interpreter of vLLM's environment (default: the one .ci/vllm-env.sh built)"
    )
    parser.add_argument("--lessons", type=int, default=0, help="lesson lines in the system prompt")
    parser.add_argument(
        "--action-mode",
        choices=("free", "choice"),
        default="free",
        help="free: the model writes each command (what the tables below measured); choice: it "
        "picks one admissible action (every action scored in one packed pass)",
    )
    parser.add_argument(
        "--no-prefix-cache", dest="prefix_cache", action="store_false", help="turn off the backend's prefix KV cache"
    )
    parser.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=None,
        help="token budget of the cache's store across turns (0: within a call only; default: the backend's)",
    )
    parser.add_argument(
        "--no-history-admissible",
        dest="history_admissible",
        action="store_false",
        help="past turns without their action list (agent.history_shows_admissible: false): "
        "prompts that are not append-only",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument(
        "--choice-batch-mb",
        type=megabytes,
        default=None,
        help="comma-separated bounds on one packed choice forward's KV (model.options.choice_batch_mb), each "
        "setting run under each in turn (default: the backend's)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every setting (interleaved)")
    parser.add_argument(
        "--games-dir",
        type=Path,
        default=Path(os.environ.get("AGENT_RUNTIME_CACHE", "~/.cache/agent-runtime")).expanduser() / "bench-games",
    )
    parser.add_argument("--profile", metavar="MODEL:SLOTS", help="cProfile one setting instead of the table")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny model, slots 1 and 4, 4 episodes of 2 steps (a smoke run of the script)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.slots, args.episodes, args.max_steps, args.max_new_tokens, args.tasks = (
            "tiny",
            "1,4",
            4,
            2,
            8,
            2,
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for model in models:
        if model not in MODELS:
            raise SystemExit(f"unknown model {model!r}; accepted: {', '.join(MODELS)}")
    if args.choice_batch_mb and args.backend != "transformers":
        raise SystemExit("--choice-batch-mb bounds the transformers backend's choice forwards; vLLM batches on its own")
    slot_counts = [int(s) for s in args.slots.split(",")]
    pregen = pregenerate(args)
    header = (
        f"# rollout throughput: {ENV_ID} level {args.level}, {args.tasks} tasks, max({args.episodes}, slots) "
        f"episodes/setting, "
        f"max {args.max_steps} steps, {args.max_new_tokens} new tokens, T={args.temperature}, CPU, "
        f"{args.backend} backend, "
        f"{args.dtype} weights, {args.lessons} lessons, prefix cache {'on' if args.prefix_cache else 'off'}"
        f"{'' if args.prefix_cache_tokens is None else f' ({args.prefix_cache_tokens} tokens)'}, "
        f"history {'with' if args.history_admissible else 'without'} action lists, "
        f"torch threads {torch.get_num_threads()}, games ready in {pregen:.1f}s, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    if args.profile:
        model, _, slots = args.profile.partition(":")
        backend = load_backend(
            model, args.dtype, args.prefix_cache, args.prefix_cache_tokens, args.backend, args.vllm_python
        )
        warm_up(backend, args)
        print(header)
        print(profile_setting(backend, model, int(slots or 1), args))
        return 0
    rows = []
    for model in models:
        backend = load_backend(
            model, args.dtype, args.prefix_cache, args.prefix_cache_tokens, args.backend, args.vllm_python
        )
        warm_up(backend, args)
        for slots in slot_counts:
            for _ in range(args.repeat):  # the bounds interleaved, so that a machine's drift hits each alike
                for bound in args.choice_batch_mb or [None]:
                    if bound is not None:
                        backend.choice_batch_bytes = int(bound * 2**20)
                    rows.append(run_setting(backend, model, slots, args))
                    print(f"  {model} x{slots}: {rows[-1]['wall_s']:.1f}s", file=sys.stderr, flush=True)
        backend.close()
    print(header)
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)\n")
    print(table(rows))
    for model in models:
        by_slots = {r["slots"]: r for r in rows if r["model"] == model}
        if 1 in by_slots and 8 in by_slots:
            ratio = by_slots[8]["episodes_per_min"] / by_slots[1]["episodes_per_min"]
            cpu_ratio = by_slots[8]["episodes_per_cpu_min"] / by_slots[1]["episodes_per_cpu_min"]
            verdict = "meets" if ratio >= 4 else "misses"
            print(
                f"\n{model}: 8 slots = {ratio:.2f}x the episodes/min of 1 slot ({verdict} the 4x target); "
                f"{cpu_ratio:.2f}x per CPU-second"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
