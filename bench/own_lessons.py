"""Does the agent learn from its own experience, with no person's lesson?

Same setting and statistics as bench/learning.py (TextWorld coin-collector level 2, 3 steps, 40 held-out games with
fixed seeds, greedy, SmolLM2-135M on CPU, choice mode). Per seed, with NO lesson written by a person:

  play       the base model plays `--episodes` train episodes at its temperature, `--explore` of its decisions
             drawn uniformly from the admissible actions (the loop's PLAY with `agent.explore`)
  induced    lessons induced from what separates its won from its lost episodes (`distill.lessons.induce`), tried
             on 24 train games (the whole set, then each one: EXTRACT with `lessons.method: evidence`); only those
             that earned their place are played on the held-out games. 24, not the quickstart's 12: at a base
             rate near 0, a set that wins 20% of the games wins none of 12 one time in 15
  untried    every induced lesson in context, tried or not (what the trial protects against)
  rounds     (`--rounds N`, seed 0 only by default) the OEL setting: the accepted lessons are consolidated by one OPCD
             cycle (the quickstart's budget), the student plays the next episodes WITHOUT lessons, lessons are
             induced again from its play and tried on top of it, consolidated on top of it, ...; the held-out
             success of each round's student without lessons is the learning curve

    .venv/bin/python bench/own_lessons.py                      # seeds 0-2, one round (resumable)
    .venv/bin/python bench/own_lessons.py --rounds 3 --round-seeds 0
    .venv/bin/python bench/own_lessons.py --report

Results are cached beside the learning study's (`<workdir>/results.json`, keys `own-evidence:...`, or
`own-evidence@x<explore>:...`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import ANCHOR, RETENTION, Study, rate, study_config

from distill.lessons.gate import mcnemar_p

TRIAL_GAMES = 24


def own_config(seed: int):
    """The study's config with lessons induced from evidence and tried on train games (no person's lesson)."""
    config = study_config(seed)
    lessons = config.lessons.model_copy(
        update={"method": "evidence", "gate_episodes": TRIAL_GAMES, "gate_split": "train", "induce_candidates": 4}
    )
    return config.model_copy(update={"lessons": lessons})


def induce_round(study: Study, store, run_id: int, seed: int, key: str, episode_ids: list[int]) -> dict:
    """EXTRACT (evidence) on `episode_ids`: the induced lessons, their trials, the accepted ones."""
    from agent_runtime.phases.extract import run_extract
    from agent_runtime.state import Run
    from distill.lessons import live_lessons

    def compute():
        started = time.perf_counter()
        report = run_extract(Run(own_config(seed), study.workdir, store, run_id), study.backend, episode_ids)
        for line in [report.line(), *report.trial_lines()]:
            print("   ", line, flush=True)
        return {
            "live": [x.text for x in live_lessons(store, run_id)[1]],
            "induced": [
                {
                    "text": x["text"],
                    "accepted": x["accepted"],
                    "summary": x["evidence"]["summary"],
                    "trial": [x["trial"]["current_rate"], x["trial"]["candidate_rate"], x["trial"]["n"]],
                }
                for x in report.induced or []
            ],
            "seconds": time.perf_counter() - started,
        }

    return study.cached(key, compute)


def prefix(explore: float, anchor: bool = False) -> str:
    return ("own-evidence" if not explore else f"own-evidence@x{explore:g}") + ("+anchor" if anchor else "")


def run(
    study: Study,
    seeds: list[int],
    episodes: int,
    rounds: int,
    round_seeds: list[int],
    explore: float,
    anchor: bool = False,
) -> None:
    from memory import ExperienceStore

    study.evaluate("base")
    study.evaluate("retention:base", env=RETENTION)
    for seed in seeds:
        print(f"seed {seed}", flush=True)
        head = prefix(explore, anchor)
        db = study.workdir / f"{head}-{seed}.db"
        if f"{head}:{seed}:r1" not in study.results:  # an unfinished seed replays from scratch
            for stale in db.parent.glob(db.name + "*"):
                stale.unlink()
        with ExperienceStore.open(db, embedder="hash") as store:
            name = f"{head}-{seed}"
            run = store.find_run(name)
            run_id = run.id if run else store.create_run(name, own_config(seed).model_dump(mode="json"))
            adapter = None
            for r in range(1, (rounds if seed in round_seeds else 1) + 1):
                key = f"{head}:{seed}:r{r}"
                if key not in study.results:
                    played = study.play(
                        store, run_id, seed, [], adapter, range((r - 1) * episodes, r * episodes), explore=explore
                    )
                    induce_round(study, store, run_id, seed, key, played)
                found = study.results[key]
                study.evaluate(f"{key}:induced", lessons=found["live"], adapter=adapter)
                if r == 1:
                    study.evaluate(f"{key}:untried", lessons=[x["text"] for x in found["induced"]])
                if seed not in round_seeds or rounds == 1 or not found["live"]:
                    continue
                trained = study.train(
                    f"{key}:cycle",
                    store,
                    run_id,
                    seed,
                    "opcd",
                    parent=adapter,
                    lessons=found["live"],
                    anchor=ANCHOR if anchor else None,
                )
                adapter = trained["adapter"]
                study.evaluate(f"{key}:student", adapter=adapter)
                study.evaluate(f"{key}:retention", adapter=adapter, env=RETENTION)


def versus(wins: list[bool] | None, reference: list[bool] | None) -> str:
    """A condition's rate with its McNemar p against `reference` (paired on the same games); '-' if not run."""
    if wins is None:
        return "-"
    return rate(wins) + (f" (p {mcnemar_p(reference, wins):.2g})" if reference is not None else "")


def report(results: dict, explore: float, anchor: bool = False) -> str:
    base, head = results["base"], prefix(explore, anchor)
    kept = results.get("retention:base")
    lines = [
        f"base (no lessons) {rate(base)} on 40 held-out games"
        + (f"; retention (treasure-hunter) {rate(kept)}" if kept else ""),
        "",
        (
            "| seed | round | lessons live after trial (tried) | held-out with them in context | vs base, McNemar p "
            "| all induced, untried | student without lessons (after consolidating), vs base | retention "
            "| EXTRACT s |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(k for k in results if k.startswith(f"{head}:") and k.count(":") == 2):
        _, seed, r = key.split(":")
        found = results[key]
        induced = results.get(f"{key}:induced")
        untried = results.get(f"{key}:untried")
        student = results.get(f"{key}:student")
        retention = results.get(f"{key}:retention")
        lines.append(
            f"| {seed} | {r[1:]} | {'; '.join(found['live']) or 'none'} ({len(found['induced'])}) | "
            f"{rate(induced) if induced else '-'} | {mcnemar_p(base, induced):.2g} | "
            f"{versus(untried, base)} | {versus(student, base)} | {versus(retention, kept)} | {found['seconds']:.0f} |"
        )
    trials = [
        f"- seed {k.split(':')[1]} round {k.split(':')[2][1:]}: "
        + "; ".join(
            f"{'LIVE' if x['accepted'] else 'out'} '{x['text']}' "
            f"({x['summary']}; {x['trial'][0]:.2f}->{x['trial'][1]:.2f})"
            for x in results[k]["induced"]
        )
        for k in sorted(results)
        if k.startswith(f"{head}:") and k.count(":") == 2
    ]
    return "\n".join(lines + ["", "Induced lessons and their trials (train games):", *trials]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/agent-runtime/learning-study")
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=32, help="train episodes played per round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--round-seeds", nargs="*", type=int, default=[0])
    parser.add_argument("--explore", type=float, default=0.5, help="share of PLAY decisions drawn uniformly")
    parser.add_argument("--report", action="store_true", help="only print the table from the cache")
    parser.add_argument(
        "--anchor",
        action="store_true",
        help="each cycle holds the student to its parent on learning.ANCHOR's games (opcd.anchor_envs)",
    )
    args = parser.parse_args(argv)
    study = Study(args.workdir)
    if not args.report:
        run(study, args.seeds, args.episodes, args.rounds, args.round_seeds, args.explore, args.anchor)
    print(report(study.results, args.explore, args.anchor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
