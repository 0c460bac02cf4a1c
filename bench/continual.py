"""Continual learning: one long-lived agent, many environments, SmolLM2-135M on CPU, held-out games with
fixed seeds, paired comparisons. Every study runs the real loop (`AgentLoop`) on a config derived from
configs/continual.yaml and reads its numbers back from the run's store; a finished run is not run again, a killed
one resumes.

  curriculum   configs/continual.yaml as it is (coin-collector, treasure-hunter, one-action quests, coin-collector
               again): the matrix R with ACC, BWT, FWT per seed, and over seeds (target b: BWT >= -3 points, no
               family loses more than 5 points after later phases, final ACC >= the base model's ACC + 15)
  mixed        coin-collector level 2 and treasure-hunter level 1 in one phase (64 episodes, about 32 each), learning
               from its own play, against `single`: coin-collector alone (32 episodes), same seeds (target a:
               coin-collector's learned success >= 90% of the single run's; treasure-hunter within 3 points of its base
               with lessons in context and after every promoted cycle, paired, pooled over the seeds, with its interval)
  retrieval    four lessons for every environment (a person's, no scope) and room for one (`lessons.context_lessons:
               1`), greedy PLAY over the three families, against the same draws with all four in context (target c:
               the chosen lesson is the environment's own in >= 95% of episodes; success no lower)
  retrieval-tried  the same four lessons as a person adds them without `--env`: each tried on every environment's
               train games (24) and live where it raised success, then one chosen per episode (target c, as the
               runtime would meet it)
  ranking      offline, over a stored curriculum run's episodes: which of the retrieval study's lessons ranks first for
               each episode, by similarity (as `choose` ranks) and by specificity to the episode's family (the
               similarity minus the nearest other family's mean episode): can any similarity place them?
  scope        a person's coin-collector lesson proposed for every environment of a coin-collector + treasure-hunter
               run: where do its per-environment trials let it in? (target d, with the real model)

    .venv/bin/python bench/continual.py curriculum --seeds 0,1,2,3,4
    .venv/bin/python bench/continual.py mixed --seeds 0,1,2
    .venv/bin/python bench/continual.py retrieval
    .venv/bin/python bench/continual.py retrieval-tried
    .venv/bin/python bench/continual.py ranking           # after curriculum (reads curriculum-s0)
    .venv/bin/python bench/continual.py scope
    .venv/bin/python bench/continual.py report            # every table from the stored runs
    .venv/bin/python bench/continual.py plot              # bench/continual.png (the README's picture)

Runs live under `--workdir` (default bench-runs/continual), one folder per study and seed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_runtime.config import config_from_dict
from agent_runtime.evaluation.matrix import load_matrix
from agent_runtime.run.loop import AgentLoop
from distill.lessons import live_lessons
from distill.lessons.gate import mcnemar_p, paired_interval
from memory import ExperienceStore

COIN, TREASURE, QUESTS = "textworld/coin_collector", "textworld/treasure_hunter", "textworld/custom"
COIN_LESSON = "Go through the exit. Look and inventory never help. When you see a coin, take coin."
RETRIEVAL_LESSONS = [
    COIN_LESSON,
    "The object you must find is already in the room. Take it.",
    "Do what your task asks in one action. Examine, look and inventory never help.",
    "In a kitchen, read the cookbook before you cook.",
]
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def base_config(seed: int) -> dict:
    data = yaml.safe_load((ROOT / "configs" / "continual.yaml").read_text())
    data["seed"] = seed
    return data


def _env(data: dict, env_id: str) -> dict:
    return next(e for e in data["envs"] if e["id"] == env_id)


def study_config(study: str, seed: int) -> dict:
    data = base_config(seed)
    if study == "curriculum":
        return data
    if study in ("mixed", "single"):
        envs = [COIN, TREASURE] if study == "mixed" else [COIN]
        data["envs"] = [_env(data, e) for e in envs]
        data["curriculum"]["phases"] = [{"name": study, "envs": envs, "episodes": 64 if study == "mixed" else 32}]
        return data
    if study in ("retrieval", "all-lessons", "retrieval-tried"):
        data["curriculum"] = None
        data["runtime"]["episodes"] = 48
        data["model"]["temperature"] = 0.0  # greedy, so that the arms play the same draws the same way
        data["agent"]["explore"] = 0.0
        data["lessons"] = {
            "enabled": False,
            "seed": RETRIEVAL_LESSONS,
            "gate_episodes": 0,
            "context_lessons": 0 if study == "all-lessons" else 1,
            "budget_tokens": 1024,
        }
        if study == "retrieval-tried":  # as `lessons add` without --env: tried on each environment's train games
            data["lessons"].update({"enabled": True, "gate_episodes": 24, "gate_split": "train", "extract_every": 1000})
        data["opcd"]["enabled"] = False
        return data
    if study == "scope":
        data["envs"] = [_env(data, COIN), _env(data, TREASURE)]
        data["curriculum"] = None
        data["runtime"]["episodes"] = 8
        data["lessons"].update({"seed": [COIN_LESSON], "extract_every": 1000})
        data["opcd"]["enabled"] = False
        return data
    raise SystemExit(f"unknown study {study!r}")


def run(study: str, seed: int, root: Path) -> Path:
    return run_config({**study_config(study, seed), "name": f"{study}-s{seed}"}, root / f"{study}-s{seed}")


def run_config(data: dict, workdir: Path) -> Path:
    """Run the loop on the config `data` in `workdir` to its end: a finished run is not run again, a killed one
    resumes; the run's wall seconds (summed over its sessions) go to `bench-seconds.json`."""
    config = config_from_dict(data)
    resume = (workdir / "memory.db").exists()
    if resume:
        with ExperienceStore.open(workdir, read_only=True) as store:
            runs = store.runs()
            if runs and runs[-1].status == "finished":
                return workdir
    started = time.perf_counter()
    loop = AgentLoop(config, workdir, resume=resume, progress=False)
    try:
        loop.run()
    finally:
        loop.close()
    elapsed = time.perf_counter() - started
    timing = workdir / "bench-seconds.json"
    before = json.loads(timing.read_text())["seconds"] if resume and timing.exists() else 0.0
    timing.write_text(json.dumps({"seconds": before + elapsed, "resumed": resume}))
    print(f"{config.name}: {elapsed / 60:.1f} min", flush=True)
    return workdir


def _matrix(workdir: Path, study: str, seed: int):
    """(the run's continual matrix, its run id)."""
    config = config_from_dict({**study_config(study, seed), "name": f"{study}-s{seed}"})
    with ExperienceStore.open(workdir, read_only=True) as store:
        run_id = store.runs()[-1].id
        return load_matrix(store, run_id, config.curriculum, [e.id for e in config.envs]), run_id


def _mean_t(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean * 100:+.1f}"
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean * 100:+.1f} [{(mean - half) * 100:+.1f}, {(mean + half) * 100:+.1f}]"


def _minutes(workdir: Path) -> str:
    path = workdir / "bench-seconds.json"
    return f"{json.loads(path.read_text())['seconds'] / 60:.1f}" if path.exists() else "?"


def report_curriculum(root: Path, seeds: list[int]) -> None:
    rows, accs, bases, bwts, fwts, drops = [], [], [], [], [], []
    for seed in seeds:
        workdir = root / f"curriculum-s{seed}"
        if not (workdir / "memory.db").exists():
            continue
        matrix, _ = _matrix(workdir, "curriculum", seed)
        if not matrix.complete():
            rows.append(f"seed {seed}: incomplete ({matrix.rows} of {len(matrix.phases)} rows)")
            continue
        print(f"seed {seed} ({_minutes(workdir)} min):\n{matrix.table()}\n")
        acc, base = matrix.acc()[0], sum(matrix.rate(0, e) for e in matrix.envs) / len(matrix.envs)
        accs.append(acc)
        bases.append(base)
        bwts.append(matrix.bwt()[0])
        fwts.append(matrix.fwt()[0])
        drops.append(min(matrix.drops().values(), default=0.0))
    if accs:
        print(f"over {len(accs)} seed(s), mean [t 95% CI], points:")
        print(
            f"  final ACC {_mean_t(accs)}; base ACC {_mean_t(bases)}; ACC - base {_mean_t([a - b for a, b in zip(accs, bases)])}"
        )
        print(
            f"  BWT {_mean_t(bwts)}; FWT {_mean_t(fwts)}; worst drop of a learned family per seed: "
            + ", ".join(f"{d * 100:+.0f}" for d in drops)
        )
    for line in rows:
        print(line)


def report_mixed(root: Path, seeds: list[int]) -> None:
    print("seed | single: coin after | mixed: coin after (ratio) | treasure base -> with lessons (after) | cycle | min")
    coin_single, coin_mixed, treasure_diffs, cycle_diffs = [], [], [], []
    for seed in seeds:
        single, mixed = root / f"single-s{seed}", root / f"mixed-s{seed}"
        if not ((single / "memory.db").exists() and (mixed / "memory.db").exists()):
            continue
        ms, _ = _matrix(single, "single", seed)
        mm, run_id = _matrix(mixed, "mixed", seed)
        if not (ms.complete() and mm.complete()):
            continue
        s, m = ms.rate(1, COIN), mm.rate(1, COIN)
        coin_single.append(s)
        coin_mixed.append(m)
        before, after = mm.cells[(0, TREASURE)], mm.cells[(1, TREASURE)]
        treasure_diffs += [int(b) - int(a) for a, b in zip(before, after)]
        with ExperienceStore.open(mixed, read_only=True) as store:
            cycles = store.cycles(run_id)
            shown = []
            for cycle in cycles:
                rows = {
                    e.metrics.get("condition"): e
                    for e in store.evaluations(run_id, cycle_id=cycle.id)
                    if e.env_id == TREASURE
                }
                after_cycle = rows.get("student_with_lessons")
                if cycle.status == "promoted" and after_cycle is not None:
                    games = {(x["task_id"], x["seed"]): x["won"] for x in after_cycle.metrics["episodes"]}
                    base = {
                        (x["task_id"], x["seed"]): x["won"] for x in rows["teacher_without_lessons"].metrics["episodes"]
                    }
                    cycle_diffs += [int(games[k]) - int(base[k]) for k in games if k in base]
                shown.append(f"{cycle.status}")
        ratio = m / s if s else float("nan")
        print(
            f"{seed} | {s:.0%} | {m:.0%} ({ratio:.2f}) | {mm.rate(0, TREASURE):.0%} -> {mm.rate(1, TREASURE):.0%} | "
            f"{', '.join(shown) or 'none'} | {_minutes(single)} + {_minutes(mixed)}"
        )
    if coin_single:
        pooled = sum(coin_mixed) / max(sum(coin_single), 1e-9)
        print(f"coin-collector, mixed / single over {len(coin_single)} seeds: {pooled:.2f} (target >= 0.90)")
    if treasure_diffs:
        _paired_line("treasure-hunter after the phase (lessons in context, adapter) minus base", treasure_diffs)
    if cycle_diffs:
        _paired_line("treasure-hunter after each promoted cycle (its adapter with lessons) minus the base", cycle_diffs)


def _paired_line(what: str, diffs: list[int]) -> None:
    lo, hi = paired_interval(diffs)
    mean = sum(diffs) / len(diffs)
    print(f"{what}, paired over {len(diffs)} games: {mean * 100:+.1f} points [95% CI {lo * 100:+.1f}, {hi * 100:+.1f}]")


def report_retrieval(root: Path, seed: int = 0, arm: str = "retrieval") -> None:
    """`arm` "retrieval": the four lessons live everywhere, one chosen per episode by similarity; "retrieval-tried":
    the four tried first on each environment's train games (live where each raised success), then one chosen."""
    retrieval, whole = root / f"{arm}-s{seed}", root / f"all-lessons-s{seed}"
    if not ((retrieval / "memory.db").exists() and (whole / "memory.db").exists()):
        return
    if arm == "retrieval-tried":
        with ExperienceStore.open(retrieval, read_only=True) as store:
            for lesson in live_lessons(store, store.runs()[-1].id)[1]:
                print(f"  after the trials, live in {[e.split('/')[-1] for e in lesson.scope]}: {lesson.text!r}")
    own_text = {COIN: RETRIEVAL_LESSONS[0], TREASURE: RETRIEVAL_LESSONS[1], QUESTS: RETRIEVAL_LESSONS[2]}
    outcomes = {}
    for name, workdir in (("retrieval", retrieval), ("whole set", whole)):
        with ExperienceStore.open(workdir, read_only=True) as store:
            run_id = store.runs()[-1].id
            texts = {x.id: x.text for x in live_lessons(store, run_id)[1]}
            episodes = [store.episode(e.id) for e in store.episodes(run_id, limit=1000, newest_first=False)]
            outcomes[name] = {e.metadata["draw"]: e.won for e in episodes}
            if name == "retrieval":
                own = [
                    len(e.lessons_in_context) == 1 and texts[e.lessons_in_context[0]] == own_text[e.env_id]
                    for e in episodes
                ]
                by_env = {
                    env: f"{sum(o for o, e in zip(own, episodes) if e.env_id == env)}/{sum(e.env_id == env for e in episodes)}"
                    for env in own_text
                }
                print(
                    f"{arm}, one lesson in context: the environment's own in {sum(own)}/{len(own)} episodes "
                    f"({sum(own) / len(own):.1%}; per environment {by_env}; target >= 95%)"
                )
    keys = sorted(set(outcomes["retrieval"]) & set(outcomes["whole set"]))
    a = [outcomes["whole set"][k] for k in keys]
    b = [outcomes["retrieval"][k] for k in keys]
    print(
        f"success on the same {len(keys)} draws (greedy): whole set {sum(a) / len(a):.1%}, {arm} "
        f"{sum(b) / len(b):.1%} ({sum(b) - sum(a):+d} episodes, McNemar p={mcnemar_p(a, b):.2g}; target: no lower)"
    )


def report_ranking(root: Path, seed: int = 0) -> None:
    """Could a better similarity place a person's unscoped lessons? Offline, over a stored curriculum run's episodes
    of the three families (their environment, goal and first observation: the query `LessonContexts.choose` builds),
    the lesson of RETRIEVAL_LESSONS each ranking puts first: by cosine similarity (what `choose` does), and by how
    much nearer the lesson is to this episode than to the nearest other family's mean episode (a lesson taken as
    belonging to the family it is most specific to)."""
    import numpy as np

    from memory.embeddings import make_embedder

    workdir = root / f"curriculum-s{seed}"
    if not (workdir / "memory.db").exists():
        return
    own = {COIN: 0, TREASURE: 1, QUESTS: 2}
    queries: dict[str, list[str]] = {env: [] for env in own}
    with ExperienceStore.open(workdir, read_only=True) as store:
        for summary in store.episodes(store.runs()[-1].id, limit=100_000, newest_first=False):
            episode = store.episode(summary.id)
            first = episode.steps[0].observation if episode.steps else ""
            queries[episode.env_id].append("\n".join(x for x in (episode.env_id, episode.goal, first) if x))
    embedder = make_embedder("minilm")

    def unit(texts: list[str]):
        vectors = np.asarray(embedder.embed(texts), dtype=np.float64)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    lessons = unit(RETRIEVAL_LESSONS)
    episodes = {env: unit(texts) for env, texts in queries.items()}
    means = {env: vectors.mean(axis=0) for env, vectors in episodes.items()}
    cells = []
    for env, vectors in episodes.items():
        similarity = vectors @ lessons.T
        nearest_other = np.max([lessons @ means[other] for other in episodes if other != env], axis=0)
        plain = int((similarity.argmax(axis=1) == own[env]).sum())
        specific = int(((similarity - nearest_other).argmax(axis=1) == own[env]).sum())
        cells.append(f"{env.split('/')[-1]} {plain}/{len(vectors)} vs {specific}/{len(vectors)}")
    print(
        f"the environment's own lesson ranked first, by similarity vs by specificity ({workdir.name}): "
        + "; ".join(cells)
    )


def report_scope(root: Path, seed: int = 0) -> None:
    workdir = root / f"scope-s{seed}"
    if not (workdir / "memory.db").exists():
        return
    with ExperienceStore.open(workdir, read_only=True) as store:
        run_id = store.runs()[-1].id
        lessons = [x for x in store.lessons(run_id) if x.metadata.get("source") == "user"]
        for lesson in lessons[:1]:
            trials = lesson.metadata.get("scope_trials", {})
            print(f"a person's coin-collector lesson proposed for every environment: live in {lesson.scope}")
            for env, d in trials.items():
                print(
                    f"  {env}: {int(d['current_successes'])}/{d['n']} -> {int(d['candidate_successes'])}/{d['n']} train games "
                    f"({'let in' if env in lesson.scope else 'kept out'})"
                )


def plot(root: Path, out: Path) -> None:
    """The README's picture: each family's held-out success after each phase of configs/continual.yaml (one line per
    family, a thin line per seed and a thick one for their mean), beside the base model's start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted(p for p in root.glob("curriculum-s*") if (p / "memory.db").exists())
    matrices = []
    for workdir in runs:
        matrix, _ = _matrix(workdir, "curriculum", int(workdir.name.rsplit("-s", 1)[1]))
        if matrix.rows >= 2:  # a run still going is drawn as far as it got
            matrices.append(matrix)
    if not matrices:
        raise SystemExit(f"no finished curriculum run under {root}: run `bench/continual.py curriculum` first")
    first = matrices[0]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colours = {COIN: "#1f77b4", TREASURE: "#d62728", QUESTS: "#2ca02c"}
    xs = list(range(min(m.rows for m in matrices)))
    for env in first.envs:
        for matrix in matrices:
            ax.plot(xs, [100 * matrix.rate(i, env) for i in xs], color=colours.get(env), alpha=0.25, lw=1)
        mean = [100 * statistics.fmean(m.rate(i, env) for m in matrices) for i in xs]
        ax.plot(xs, mean, color=colours.get(env), lw=2.5, marker="o", label=env.split("/")[-1].replace("_", "-"))
    ax.set_xticks(
        xs, ["start\n(base)"] + [f"after {i}\n{label}" for i, label in enumerate(first.phases[1 : len(xs)], 1)]
    )
    ax.set_ylabel("held-out success (%)")
    ax.set_ylim(-2, 102)
    acc = statistics.fmean(m.acc()[0] for m in matrices) * 100
    bwt = statistics.fmean(m.bwt()[0] for m in matrices) * 100
    done = f"{len(xs) - 1} of {len(first.phases) - 1} phases" if len(xs) < len(first.phases) else "all phases"
    ax.set_title(
        f"One agent, three TextWorld families in sequence (SmolLM2-135M, CPU, {len(matrices)} seed(s), 20 held-out "
        f"games each)\nafter {done}: ACC {acc:.1f}%, BWT {bwt:+.1f} points; each family's lessons only in its prompts",
        fontsize=9,
    )
    ax.legend(loc="center right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "study", choices=("curriculum", "mixed", "retrieval", "retrieval-tried", "ranking", "scope", "report", "plot")
    )
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench-runs" / "continual")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    root = args.workdir
    root.mkdir(parents=True, exist_ok=True)
    if args.study == "curriculum":
        for seed in seeds:
            run("curriculum", seed, root)
        report_curriculum(root, seeds)
    elif args.study == "mixed":
        for seed in seeds:
            run("single", seed, root)
            run("mixed", seed, root)
        report_mixed(root, seeds)
    elif args.study == "retrieval":
        run("retrieval", seeds[0], root)
        run("all-lessons", seeds[0], root)
        report_retrieval(root, seeds[0])
    elif args.study == "retrieval-tried":
        run("retrieval-tried", seeds[0], root)
        run("all-lessons", seeds[0], root)
        report_retrieval(root, seeds[0], "retrieval-tried")
    elif args.study == "ranking":
        report_ranking(root, seeds[0])
    elif args.study == "scope":
        run("scope", seeds[0], root)
        report_scope(root, seeds[0])
    elif args.study == "plot":
        plot(root, ROOT / "bench" / "continual.png")
    else:
        # a study's run is "<study>-s<seed>"; other folders beside them (a kept variant) are not runs
        suffixes = (p.name.rsplit("-s", 1)[1] for p in root.glob("*-s*") if p.is_dir())
        every = sorted({int(s) for s in suffixes if s.isdigit()})
        report_curriculum(root, every)
        report_mixed(root, every)
        report_retrieval(root)
        report_retrieval(root, arm="retrieval-tried")
        report_scope(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
