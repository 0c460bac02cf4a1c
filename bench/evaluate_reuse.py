"""Benchmark of repeated held-out evaluations in one process: seconds per `evaluate()` call, cold and warm.

An OPCD cycle evaluates 5-9 times (and the lesson gate and trials more) on the same environments. Without reuse
every call builds the env specs again and starts a new game process per slot (a TextWorld interpreter: ~0.1 s
each); with the process's `EnvPool` the second and later calls borrow the started instances. The policy is the
scripted backend (random-admissible, seeded), so the model costs nothing and what is left is the runtime's own
overhead; `--tiny` uses the tiny random model of `agent_runtime.testing` instead. Every call must play the same
episodes (won/lost per task and seed); the script fails otherwise.

Rows: `fresh` (reuse=False, as before the pool), `pool cold` (the first call on an empty pool), `pool warm` (the
later ones); and one environment instance's reset, new against lent again.

Usage: `python bench/evaluate_reuse.py [--games 20] [--level 2] [--slots 8] [--calls 4] [--tiny] [--games-dir D]`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_runtime.config import config_from_dict
from agent_runtime.episode.build import build_envs
from agent_runtime.evaluation import EnvPool, evaluate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", type=int, default=20, help="eval games (coin_collector)")
    parser.add_argument("--level", type=int, default=2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--calls", type=int, default=4, help="evaluate() calls per way")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model instead of the scripted policy")
    parser.add_argument("--games-dir", default=None, help="game cache (default: the shared one)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-evaluate-reuse-"))
    kwargs = {"level": args.level, "n_eval": args.games, **({"cache_dir": args.games_dir} if args.games_dir else {})}
    model = {"name": "scripted", "backend": "scripted"}
    if args.tiny:
        from agent_runtime.testing import save_tiny_model

        model = {"name": str(save_tiny_model(work / "tiny")), "max_new_tokens": 8, "device": "cpu"}
    config = config_from_dict(
        {
            "name": "bench",
            "model": model,
            "runtime": {"slots": args.slots},
            "envs": [{"id": "textworld/coin_collector", "max_steps": 3 if args.level == 2 else None, "kwargs": kwargs}],
            "evaluation": {"episodes_per_env": args.games},
        }
    )

    def backend():
        if not args.tiny:
            from agent_runtime.llm.scripted import ScriptedBackend

            return ScriptedBackend(seed=0)
        from agent_runtime.llm import make_backend

        return make_backend(config.model, seed=0)

    tiny = backend() if args.tiny else None  # one model for every call (loading it is not what is measured)

    def call(**kw) -> tuple[float, list]:
        policy = tiny or backend()  # the scripted policy is seeded anew, so every call plays the same
        start = time.perf_counter()
        [result] = evaluate(config, work, policy, **kw)
        return time.perf_counter() - start, [(e["task_id"], e["seed"], e["won"]) for e in result.episodes]

    call(reuse=False)  # generates the games when the cache has none and starts the game process server
    fresh = [call(reuse=False) for _ in range(args.calls)]
    pool = EnvPool()
    pooled = [call(pool=pool) for _ in range(args.calls)]
    outcomes = {repr(o) for _, o in fresh + pooled}
    if len(outcomes) != 1 and not args.tiny:
        print("FAILED: the calls did not play the same episodes", file=sys.stderr)
        return 1

    specs, tasks = build_envs(config, work, split="eval")
    env = specs[0].factory()
    start = time.perf_counter()
    env.reset(seed=0, task_id=tasks[0][0])
    new = time.perf_counter() - start
    lent = []
    for task in tasks[0][1:6]:
        start = time.perf_counter()
        env.reset(seed=0, task_id=task)
        lent.append(time.perf_counter() - start)
    env.close()
    pool.close()

    won = sum(w for *_, w in pooled[0][1])
    print(
        f"coin_collector level {args.level}, {args.games} eval games, {args.slots} slots, "
        f"{'tiny model' if args.tiny else 'scripted policy'}: {won}/{args.games} won, "
        f"{'same' if len(outcomes) == 1 else 'DIFFERENT'} episodes in every call\n"
    )
    print("| evaluate() | calls | s per call | calls' seconds |")
    print("|---|---|---|---|")
    rows = [
        ("fresh (reuse=False)", [t for t, _ in fresh]),
        ("pool cold (1st call)", [pooled[0][0]]),
        ("pool warm (later calls)", [t for t, _ in pooled[1:]]),
    ]
    for name, times in rows:
        print(f"| {name} | {len(times)} | {statistics.mean(times):.3f} | {' '.join(f'{t:.3f}' for t in times)} |")
    print(f"\nenv instance reset: new {new:.3f} s, lent again (another game) {statistics.median(lent):.3f} s")
    print(f"pool: {pool.started} instances started, {pool.reused} lent again")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
