"""Benchmark of the built-in environments: game generation, reset and step latency. Prints a markdown table.

Per environment (small default parameters, a fresh game cache in a temporary folder):
1. generation: time of the first reset on `--games` never-seen tasks (cold cache): TextWorld
   generates and compiles a game, ALFWorld generates a game and runs alfworld's expert to check it,
   the others build their task in memory. The first TextWorld game of a process also pays for
   TextWorld's one-off grammar parsing; that is shown separately as "first game";
2. reset: median and p95 latency of `reset(task_id=...)` on already generated tasks (warm cache);
3. step: median and p95 latency of `step()` with random admissible actions (episodes restarted when
   they end).
For the games on the JVM (twx/*, scienceworld/*) the first game includes starting the JVM, shown separately as "JVM
start"; the resets after it are those of an instance the environment pool lends again (the same JVM). A row whose
label has words after the id ("scienceworld/boil (no action list)") plays that id with its settings.

Usage: `python bench/envs.py [--games 3] [--resets 20] [--steps 200] [--only textworld/cooking,...]`.
`python bench/envs.py --check scienceworld/` instead runs `check_env` on every registered environment whose id starts
with the prefix (each on a fresh instance, closed after) and prints a table of failures and times.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import environments

SETTINGS = {
    "textworld/coin_collector": {"level": 5},
    "textworld/treasure_hunter": {"level": 5},
    "textworld/cooking": {"recipe": 2, "take": 2, "go": 6, "open": True, "cut": True, "cook": True},
    "textworld/simple": {},
    "textworld/custom": {"nb_rooms": 4, "nb_objects": 8, "quest_length": 4},
    "alfworld/text": {},
    "textarena/frozenlake": {},
    "textarena/sokoban": {},
    "math/gsm_symbolic": {},
    "math/champ": {},
    "math/gsm8k": {},
    # on the JVM (environments/java.py): the first reset starts it; resets and steps reuse it
    "twx/coin": {},
    "twx/cookingworld": {},
    "twx/twc": {},
    "twx/simonsays": {},
    "scienceworld/find-living-thing": {},
    "scienceworld/boil (no action list)": {"admissible_actions": False},
}


def _ms(seconds: list[float], q: float) -> str:
    if not seconds:
        return "-"
    ordered = sorted(seconds)
    value = statistics.median(ordered) if q == 0.5 else ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return f"{value * 1000:.1f}"


def bench(label: str, kwargs: dict, games: int, resets: int, steps: int) -> dict[str, str]:
    env_id = label.split(" ")[0]
    env = environments.make(env_id, **kwargs)
    tasks = list(env.tasks("train")[:games])
    cold = []
    for task in tasks:
        start = time.perf_counter()
        env.reset(task_id=task)
        cold.append(time.perf_counter() - start)
    warm = []
    rng = random.Random(0)
    for _ in range(resets):
        task = rng.choice(tasks)
        start = time.perf_counter()
        env.reset(task_id=task)
        warm.append(time.perf_counter() - start)
    step_times = []
    _, info = env.reset(task_id=tasks[0])
    while len(step_times) < steps:
        actions = info.get("admissible_actions") or ["look", "look around", "inventory", "go to kitchen"]
        action = rng.choice(actions)
        start = time.perf_counter()
        result = env.step(action)
        step_times.append(time.perf_counter() - start)
        info = result.info
        if result.terminated or result.truncated:
            _, info = env.reset(task_id=rng.choice(tasks))
    server = getattr(env, "server", None)
    jvm = f"{server.start_seconds:.2f}" if server is not None and server.starts else "-"
    env.close()
    later = cold[1:] or cold
    return {
        "env": label,
        "first game (s)": f"{cold[0]:.2f}",
        "JVM start (s)": jvm,
        "generation median (s)": f"{statistics.median(later):.2f}",
        "reset p50 (ms)": _ms(warm, 0.5),
        "reset p95 (ms)": _ms(warm, 0.95),
        "step p50 (ms)": _ms(step_times, 0.5),
        "step p95 (ms)": _ms(step_times, 0.95),
    }


def check(prefix: str) -> None:
    from environments.checker import env_failures

    ids = sorted(r.id for r in environments.list_envs() if r.id.startswith(prefix))
    print("| env | check_env | seconds |")
    print("|---|---|---|")
    for env_id in ids:
        started = time.perf_counter()
        env = environments.make(env_id)
        try:
            failures = env_failures(env)
        finally:
            env.close()
        verdict = "passes" if not failures else "; ".join(failures)
        print(f"| {env_id} | {verdict} | {time.perf_counter() - started:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", default=None, help="run check_env on every environment whose id starts with this")
    parser.add_argument("--games", type=int, default=3)
    parser.add_argument("--resets", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated env ids (default: all in SETTINGS)")
    args = parser.parse_args()
    if args.check is not None:
        check(args.check)
        return
    ids = [i for i in args.only.split(",") if i] or list(SETTINGS)
    with tempfile.TemporaryDirectory() as tmp:
        problems = Path(tmp) / "gsm8k.jsonl"
        problems.write_text(
            "\n".join(json.dumps({"question": f"What is {n} + {n}?", "answer": f"#### {2 * n}"}) for n in range(200))
        )
        rows = []
        for env_id in ids:
            kwargs = dict(SETTINGS.get(env_id, {}))
            if env_id.startswith(("textworld/", "alfworld/")):
                kwargs["cache_dir"] = tmp
            if env_id == "math/gsm8k":
                kwargs["path"] = str(problems)
            rows.append(bench(env_id, kwargs, args.games, args.resets, args.steps))  # env_id: a row's label
            print(f"done {env_id}", file=sys.stderr, flush=True)
    header = list(rows[0])
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row[h] for h in header) + " |")


if __name__ == "__main__":
    main()
