"""Are the three folds one distribution? The base policy and a fixed lesson played on the first N games of each fold
(train, validation, eval), greedy with the evaluation seeds, on the same model.

Why: a decision reads the validation fold and the tables read the eval fold, so the two must measure the same thing;
and a lesson's trial on one fold must predict what it does on another. Per fold the table gives each condition's
rate with its Wilson 95% interval, the lesson's paired gain (exact McNemar p), and, between folds, a two-sided
Fisher exact p for each condition's rates (unpaired: the folds hold different games). A gain the trial's size cannot
see is marked with the smallest gain that size sees (`distill.evidence.trial_sight`).

    .venv/bin/python bench/folds.py                                  # the quickstart's game and lesson, 40 games
    .venv/bin/python bench/folds.py --games 60 --config configs/continual.yaml --env textworld/custom --lesson "..."

Results are cached per (fold, condition) in `<workdir>/folds.json` (default ~/.cache/agent-runtime/folds-study): a
killed study resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FOLDS = ("train", "validation", "eval")


def fisher_p(a_wins: int, a_n: int, b_wins: int, b_n: int) -> float:
    """Two-sided Fisher exact p for two independent rates (sum of the tables no more likely than the observed)."""
    wins, n = a_wins + b_wins, a_n + b_n

    def prob(k: int) -> float:
        return math.comb(a_n, k) * math.comb(b_n, wins - k) / math.comb(n, wins)

    observed = prob(a_wins)
    low, high = max(0, wins - b_n), min(a_n, wins)
    return min(1.0, sum(prob(k) for k in range(low, high + 1) if prob(k) <= observed * (1 + 1e-9)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--env", default=None, help="the environment id of the config to play (default: its first)")
    parser.add_argument("--lesson", default=None, help="the lesson (default: the config's first lessons.seed)")
    parser.add_argument("--games", type=int, default=40, help="games per fold")
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/agent-runtime/folds-study")
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args(argv)

    from agent_runtime.config import load_config
    from agent_runtime.evaluation import evaluate
    from agent_runtime.llm import make_backend
    from distill.evidence import trial_sight
    from distill.lessons.gate import mcnemar_p
    from memory.intervals import wilson_interval

    config = load_config(args.config)
    entry = next((e for e in config.envs if args.env in (None, e.id)), None)
    if entry is None:
        parser.error(f"{args.config} has no environment {args.env!r}; it has {', '.join(e.id for e in config.envs)}")
    lesson = args.lesson or (config.lessons.seed or [None])[0]
    if not lesson:
        parser.error("give --lesson: the config seeds none")
    sizes = {f"n_{fold}": args.games for fold in FOLDS}
    entry = entry.model_copy(update={"kwargs": {**entry.kwargs, **sizes}})
    config = config.model_copy(update={"envs": [entry], "curriculum": None})
    args.workdir.mkdir(parents=True, exist_ok=True)
    cache_file = args.workdir / "folds.json"
    key_of = json.dumps({"env": entry.model_dump(), "lesson": lesson, "model": config.model.name})
    cache = {} if args.fresh or not cache_file.exists() else json.loads(cache_file.read_text())
    results = cache.setdefault(key_of, {})
    backend = None
    for fold in FOLDS:
        for condition, lessons in (("base", []), ("lesson", [lesson])):
            key = f"{fold}:{condition}"
            if key in results and len(results[key]) == args.games:
                continue
            backend = backend or make_backend(config.model, seed=config.seed)
            started = time.perf_counter()
            [result] = evaluate(config, args.workdir, backend, lessons=lessons, episodes_per_env=args.games, split=fold)
            results[key] = [bool(e["won"]) for e in result.episodes]
            cache_file.write_text(json.dumps(cache))
            print(f"  {key}: {sum(results[key])}/{args.games} in {time.perf_counter() - started:.0f}s", flush=True)

    def rate(wins: list[bool]) -> str:
        lo, hi = wilson_interval(sum(wins), len(wins))
        return f"{sum(wins):3d}/{len(wins)} {sum(wins) / len(wins):6.1%} [{lo:.0%}-{hi:.0%}]"

    print(f"\n{entry.id} {entry.kwargs}, {args.games} games per fold, greedy, evaluation seeds; lesson: {lesson!r}")
    print(f"{'fold':<11} {'base':<24} {'lesson':<24} gain (paired, McNemar p)")
    for fold in FOLDS:
        base, with_lesson = results[f"{fold}:base"], results[f"{fold}:lesson"]
        gain = (sum(with_lesson) - sum(base)) / args.games
        print(f"{fold:<11} {rate(base):<24} {rate(with_lesson):<24} {gain:+.1%} (p {mcnemar_p(base, with_lesson):.2g})")
    print("between folds (two-sided Fisher exact p of each condition's rates):")
    for condition in ("base", "lesson"):
        pairs = []
        for i, a in enumerate(FOLDS):
            for b in FOLDS[i + 1 :]:
                wa, wb = results[f"{a}:{condition}"], results[f"{b}:{condition}"]
                pairs.append(f"{a}/{b} p {fisher_p(sum(wa), len(wa), sum(wb), len(wb)):.2g}")
        print(f"  {condition:<7} " + ", ".join(pairs))
    for n in (12, 24, 40):
        print(f"  {trial_sight(n).line(f'a trial of {n} games')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
