"""Scale-out throughput: episodes/min of the agent loop's PLAY with the local executor and 1, 2, 4 Ray workers.

Each setting runs the real `AgentLoop` (driver, SQLite or PostgreSQL store, one transaction per episode)
on the same draws of a fresh run; only PLAY runs (lessons and OPCD off). Two regimes:

- `scripted` (default): the scripted policy (random admissible action, no model) on TextWorld coin_collector
  level 1, 8 steps at most. Generation costs nothing, so this measures environment stepping (a dumb-frotz
  process per slot) and the driver's commits: the upper bound of what workers add when the policy is free.
- `tiny`: the random tiny Llama of `agent_runtime.testing` on math/gsm_symbolic (one turn per episode,
  32 new tokens), with the transformers backend on CPU in every worker: generation-bound.

Ray is started here with as many logical CPUs as the largest worker count, so 4 workers are scheduled on a
machine that may have fewer cores: where the rate stops growing with workers, the cores (or the driver)
are the limit, which is the point of the table. "startup" is building the workers (process start, imports,
model load, environment probe), paid once per run and not counted in the rate; "commit ms/ep" is the
driver's time inside `store.add_episode`, the part of the loop that does not scale out.

    .venv/bin/python bench/scale.py                                   # scripted, local + 1,2,4 workers
    .venv/bin/python bench/scale.py --model tiny --episodes 24
    .venv/bin/python bench/scale.py --workers 1,2 --episodes 8 --quick
    .venv/bin/python bench/scale.py --memory-url postgresql+psycopg://agent:agent@127.0.0.1:5432/agent_bench
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from agent_runtime.config import RunConfig, config_from_dict
from agent_runtime.run.loop import AgentLoop


@dataclass
class Row:
    executor: str
    workers: int
    slots: int
    startup_s: float
    play_s: float
    episodes: int
    commit_ms: float

    @property
    def per_min(self) -> float:
        return self.episodes / self.play_s * 60 if self.play_s else 0.0


def make_config(args, executor: str, workers: int, memory_url: str | None) -> RunConfig:
    if args.model == "scripted":
        model = {"name": "scripted", "backend": "scripted"}
        envs = [
            {
                "id": "textworld/coin_collector",
                "max_steps": 8,
                "kwargs": {"level": 1, "n_train": 8, "cache_dir": str(args.games_dir)},
            }
        ]
    else:
        from agent_runtime.testing import save_tiny_model

        tiny = Path(args.games_dir).parent / "bench-tiny-llama"
        if not (tiny / "config.json").is_file():
            save_tiny_model(tiny)
        model = {"name": str(tiny), "max_new_tokens": 32}
        envs = [{"id": "math/gsm_symbolic"}]
    runtime = {
        "slots": args.slots,
        "episodes": args.episodes,
        "executor": executor,
        "summary_every": 10_000,
        "ray": {"workers": workers, "slots": args.slots, "worker_cpus": 1},
    }
    name = f"scale-{executor}-{workers}-{int(time.time())}"  # runs apart in a shared --memory-url store
    data = {"name": name, "seed": 0, "model": model, "envs": envs, "runtime": runtime}
    if memory_url:
        data["memory"] = {"url": memory_url}
    return config_from_dict(data)


def run_setting(args, executor: str, workers: int, root: Path) -> Row:
    config = make_config(args, executor, workers, args.memory_url)
    loop = AgentLoop(config, root / f"{executor}-{workers}", progress=False)
    commit = {"s": 0.0}
    add_episode = loop.store.add_episode

    def timed_add_episode(*a, **kw):
        t = time.perf_counter()
        try:
            return add_episode(*a, **kw)
        finally:
            commit["s"] += time.perf_counter() - t

    loop.store.add_episode = timed_add_episode
    startup = 0.0
    if executor == "ray":  # build the workers before the clock starts (the loop would at its first PLAY)
        t = time.perf_counter()
        assert loop.executor is not None
        startup = time.perf_counter() - t
    t = time.perf_counter()
    summary = loop.run()
    play = time.perf_counter() - t
    loop.close()
    return Row(
        executor,
        workers if executor == "ray" else 0,
        args.slots * max(workers, 1),
        startup,
        play,
        summary.new_episodes,
        commit["s"] / max(summary.new_episodes, 1) * 1000,
    )


def table(rows: list[Row], args) -> str:
    base = rows[0].per_min if rows else 0.0
    head = (
        f"model {args.model}, {args.episodes} episodes per setting, {args.slots} slots per worker, "
        f"{os.cpu_count()} cores, {args.threads} torch thread(s) per process, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    lines = [
        head,
        "",
        "| executor | workers | slots | startup s | play s | episodes/min | vs local | commit ms/ep |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.executor} | {r.workers or '-'} | {r.slots} | {r.startup_s:.1f} | {r.play_s:.1f} | "
            f"{r.per_min:.1f} | {r.per_min / base:.2f}x | {r.commit_ms:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("scripted", "tiny"), default="scripted")
    parser.add_argument("--workers", default="1,2,4", help="comma-separated Ray worker counts")
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--slots", type=int, default=2, help="environment slots per worker (and locally)")
    parser.add_argument(
        "--games-dir",
        type=Path,
        default=Path(os.environ.get("AGENT_RUNTIME_CACHE", Path.home() / ".cache/agent-runtime")) / "bench-games",
    )
    parser.add_argument("--memory-url", help="SQLAlchemy URL of a shared store (default: SQLite per setting)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the driver (the local baseline); Ray gives each worker "
        "OMP_NUM_THREADS = worker_cpus = 1, so 1 compares like with like",
    )
    parser.add_argument("--quick", action="store_true", help="skip the local baseline")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    counts = [int(x) for x in args.workers.split(",")]

    import ray

    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False, object_store_memory=100_000_000)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            if not args.quick:
                rows.append(run_setting(args, "local", 1, Path(tmp)))
            for n in counts:
                rows.append(run_setting(args, "ray", n, Path(tmp)))
                print(f"  {n} workers: {rows[-1].per_min:.1f} episodes/min", file=sys.stderr)
    finally:
        ray.shutdown()
    print(table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
