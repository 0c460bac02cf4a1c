"""The TALES protocol: the suite's TextWorld Express and ScienceWorld games, one held-out game each, 100
steps, TALES' metric (highest score over the maximum, averaged per framework), beside the leaderboard's rows.

Plays configs/tales.yaml's model and agent settings on every game of the suite (agent_runtime/evaluation/tales.py:
the built-ins `tales/<name>` and `scienceworld/<task>`) through the runtime's `evaluate` (the first game of each framework's test fold), up to `--batch` games side by side (games with
different environment ids; the model's calls are batched, greedy). Each round's results are written to
`<workdir>/results.json` as it finishes: a rerun prints the table, a killed run resumes at the next round.

    .venv/bin/python bench/tales.py                                     # both frameworks, free text (TALES')
    .venv/bin/python bench/tales.py --frameworks twx --modes free,choice
    .venv/bin/python bench/tales.py --frameworks twx --limit 2 --steps 5 --set model.backend=scripted   # smoke

Differences from TALES' own harness are printed under the table (agent_runtime/evaluation/tales.py says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_runtime.config import load_config
from agent_runtime.evaluation import close_env_pool, evaluate
from agent_runtime.evaluation.tales import FRAMEWORKS, LEADERBOARD, framework_means, normalized_score, suite
from agent_runtime.llm import make_backend

DIFFERENCES = (
    "Protocol differences from TALES' harness: an episode ends when the game ends (TALES restarts it and plays on "
    "within the 100 steps, keeping the best score: a won game scores the same, a lost one keeps what it had); this "
    "runtime's prompt (its system prompt, the last agent.max_history_turns turns), not TALES' zero-shot agent's; "
    "a reply the runtime cannot read as one command (prose, several sentences) is answered 'not a valid action' "
    "instead of being sent to the game, which would answer that it does not understand (either way no score); "
    "'choice' (picking among the admissible actions) is ours and not comparable with the leaderboard."
)


def _games(frameworks: tuple[str, ...], mode: str, steps: int, limit: int | None) -> list:
    """The suite's games of `frameworks` for `mode`, the first `limit` of each framework (all without)."""
    games = suite(frameworks, mode=mode, steps=steps)
    if limit is None:
        return games
    return [game for framework in frameworks for game in [g for g in games if g.framework == framework][:limit]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "tales.yaml"))
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help=f"of {', '.join(FRAMEWORKS)}")
    parser.add_argument("--modes", default="free", help="free (TALES' protocol) and/or choice (ours)")
    parser.add_argument("--steps", type=int, default=100, help="steps per game (TALES: 100)")
    parser.add_argument("--limit", type=int, default=None, help="the first N games of each framework")
    parser.add_argument("--batch", type=int, default=8, help="games played side by side (distinct environment ids)")
    parser.add_argument("--workdir", default=str(ROOT / "bench-runs" / "tales"))
    parser.add_argument("--set", action="append", default=[], help="config overrides, as `agent-runtime run --set`")
    args = parser.parse_args(argv)
    frameworks = tuple(f for f in args.frameworks.split(",") if f)
    modes = [m for m in args.modes.split(",") if m]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    results_path = workdir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    base = load_config(args.config, args.set)
    policy = f"{base.model.name} ({base.model.backend})"
    backend = None
    try:
        for mode in modes:
            games = _games(frameworks, mode, args.steps, args.limit)
            pending = [g for g in games if f"{policy}|{mode}|{args.steps}|{g.name}" not in results]
            done = len(games) - len(pending)
            while pending:
                # a round plays up to --batch games side by side (one batched model call per turn), each a different
                # environment id: a config names an id once
                batch, ids = [], set()
                for game in list(pending):
                    if game.entry["id"] not in ids and len(batch) < args.batch:
                        batch.append(game)
                        ids.add(game.entry["id"])
                        pending.remove(game)
                data = base.model_dump(mode="json")
                data["envs"] = [game.entry for game in batch]
                data["agent"]["action_mode"] = mode
                data["agent"]["show_admissible_actions"] = mode == "choice"
                data["runtime"]["slots"] = len(batch)
                config = type(base).model_validate(data)
                if backend is None:
                    backend = make_backend(config.model, seed=config.seed)
                begun = time.perf_counter()
                played: dict[str, list[dict]] = {}
                evaluate(
                    config,
                    workdir / "run",
                    backend,
                    episodes_per_env=1,
                    on_record=lambda record, into=played: into.__setitem__(
                        record.env_id, [step.info for step in record.steps]
                    ),
                )
                seconds = round(time.perf_counter() - begun, 1)
                for game in batch:
                    steps = played.get(game.entry["id"], [])
                    key = f"{policy}|{mode}|{args.steps}|{game.name}"
                    results[key] = {
                        "score": normalized_score(steps),
                        "steps": len(steps),
                        "won": any(i.get("won") for i in steps),
                        "round_seconds": seconds,
                        "round_games": len(batch),
                    }
                    done += 1
                    print(
                        f"[{mode} {done}/{len(games)}] {game.name}: {results[key]['score']:.1%} in {len(steps)} steps "
                        f"(its round of {len(batch)}: {seconds:.0f} s)",
                        flush=True,
                    )
                results_path.write_text(json.dumps(results, indent=1, sort_keys=True))
                close_env_pool()  # the round's JVMs: stop them before the next round's
    finally:
        if backend is not None:
            backend.close()
    print_table(results, policy, modes, frameworks, args.steps, args.limit)
    return 0


def print_table(results: dict, policy: str, modes: list[str], frameworks: tuple[str, ...], steps: int, limit) -> None:
    names = {"twx": "TextWorld Express", "scienceworld": "ScienceWorld"}
    print(f"\nTALES' metric (mean of highest score / maximum per game, %), {steps} steps per game")
    print("| policy | protocol | " + " | ".join(names[f] for f in frameworks) + " |")
    print("|---|---|" + "---|" * len(frameworks))
    for mode in modes:
        games = _games(frameworks, mode, steps, limit)
        scores = {g.name: results[k]["score"] for g in games if (k := f"{policy}|{mode}|{steps}|{g.name}") in results}
        means = framework_means(scores, games)
        total = {f: sum(1 for g in games if g.framework == f) for f in frameworks}
        cells = [f"{means[f][0]:.1%} ({means[f][1]}/{total[f]} games)" if f in means else "not run" for f in frameworks]
        label = "free text (TALES')" if mode == "free" else "choice among admissible (ours)"
        print(f"| {policy} | {label} | " + " | ".join(cells) + " |")
    for name, (twx, science) in LEADERBOARD.items():
        cells = [f"{twx:.1f}%" if f == "twx" else f"{science:.1f}%" for f in frameworks]
        print(f"| {name} (TALES leaderboard) | TALES' harness | " + " | ".join(cells) + " |")
    print(f"\n{DIFFERENCES}")


if __name__ == "__main__":
    raise SystemExit(main())
