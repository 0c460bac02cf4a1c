"""The learning study: does each stage of the cycle pay off, measured on held-out games with SmolLM2-135M on CPU.

Setting (why this one): TextWorld coin-collector level 2 with at most 3 steps. The coin is one room away: the
agent must go through the room's only exit, then `take coin`; `look` and `inventory` are admissible too. In
choice mode SmolLM2-135M-Instruct takes the coin when it sees it but, in the first room, prefers `look`, so it
wins about 1 game in 13, below a random admissible player: neither at 0% nor at 100%, with a mistake that a
sentence can fix. (Level 1, the coin in the first room, is solved by the base model at ~98%; FrozenLake and
longer coin-collector levels stay at 0% with or without any lesson we tried; treasure-hunter level 1 moved
the wrong way with the lessons we tried. See bench/RESULTS.md.) Retention is measured on treasure-hunter
level 1 with one step (find the named object among distractors; base ~75%), which no cycle trains on.

Arms, every one on the same 40 held-out tasks with the same seeds, greedy (paired comparisons):
  random        a uniformly random admissible action (the baseline every rate is read against)
  level1        random and base on coin-collector level 1, first decision: choice mode where no lesson is needed
  base          the model without lessons
  given         the user's lesson in context (`lessons add` / `lessons.seed`): GIVEN below
  own           the agent's own lessons in context: extracted by the model itself from 16 of its own
                train episodes (contrastive won/lost extraction), after the safety screen
  opcd          the student WITHOUT the lesson after one OPCD cycle on the choice policy (exact reverse KL over
                each step's admissible set), prompts = the per-turn prefixes of 16 train episodes the agent
                played with the lesson in context (the loop's PLAY), 8 steps, batch 4, lr 1e-4, LoRA r 8
  off_policy    the same budget, forward KL (the teacher's choice distribution as the target)
  sft           the same budget, cross-entropy on an action drawn from the teacher's choice distribution
  harmful       HARMFUL added to the given lesson, as a candidate lesson set: the gate must block it
  retention     base vs the OPCD adapters on treasure-hunter (not trained on)
  cycles        three OPCD cycles in a row (seed 0): each plays new episodes with its parent adapter and the
                lesson, and trains on top of the parent; success without lessons after each
Training arms and own lessons repeat over 3 seeds (episode sampling, LoRA init, batch order).

Statistics: Wilson 95% intervals; paired differences with an exact McNemar test (two-sided) on the
discordant tasks; "gain kept" = (student without lessons - base) / (given - base) per seed.

    .venv/bin/python bench/learning.py                    # everything (~40 min on 2 cores), resumable
    .venv/bin/python bench/learning.py --report           # print the table and redraw the plot from the cache

Results are cached per arm in `<workdir>/results.json` (default ~/.cache/agent-runtime/learning-study): a killed
study resumes where it stopped, and `--fresh` starts over. The table goes to stdout and bench/learning.md,
the plot to bench/learning.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distill.lessons.gate import mcnemar_p
from memory.intervals import wilson_interval

GIVEN = "Go through the exit. Look and inventory never help. When you see a coin, take coin."
HARMFUL = "Always reply look."
SEEDS = (0, 1, 2)
OBJECTIVES = ("opcd", "off_policy", "sft")
ENV = {"id": "textworld/coin_collector", "max_steps": 3, "kwargs": {"level": 2, "n_train": 32, "n_eval": 40}}
RETENTION = {"id": "textworld/treasure_hunter", "max_steps": 1, "kwargs": {"level": 1, "n_train": 8, "n_eval": 40}}
TRAINER = {"steps": 8, "batch_size": 4, "lr": 1e-4, "lora_r": 8, "temperature": 0.7, "gradient_checkpointing": False}
LEVEL1 = {"id": "textworld/coin_collector", "max_steps": 1, "kwargs": {"level": 1, "n_train": 8, "n_eval": 40}}
TRAIN_EPISODES = 16
# the anchor env of `--anchor` runs (opcd.anchor_envs): TextWorld custom games, two rooms, a one-action quest in the
# first room (open, close, eat, drop, put, insert, unlock, take): an exit is there, and going through it is wrong
ANCHOR = {
    "id": "textworld/custom",
    "max_steps": 2,
    "kwargs": {"nb_rooms": 2, "nb_objects": 4, "quest_length": 1, "n_train": 16, "n_eval": 40},
}
ANCHOR_EPISODES = 16
HERE = Path(__file__).resolve().parent


def study_config(seed: int = 0, objective: str = "opcd"):
    from agent_runtime.config import config_from_dict

    return config_from_dict(
        {
            "name": f"learning-study-{seed}",
            "seed": seed,
            "model": {"name": "smollm2-135m-instruct", "max_new_tokens": 12, "temperature": 0.7},
            "envs": [ENV],
            "agent": {"max_history_turns": 3},
            "runtime": {"slots": 8},
            "evaluation": {"episodes_per_env": 40},
            "lessons": {
                "enabled": True,
                "gate_episodes": 0,
                "max_new_tokens": 48,
                "max_trajectory_chars": 2000,
                "budget_tokens": 256,
                "contrastive": True,
                "embedder": "hash",
            },
            "opcd": {
                "enabled": True,
                "trainer": {**TRAINER, "objective": objective, "seed": seed},
                "retention_envs": [RETENTION],
            },
        }
    )


# -- statistics ---------------------------------------------------------------------------------------------
def rate(wins: list[bool]) -> str:

    lo, hi = wilson_interval(sum(wins), len(wins))
    return f"{sum(wins) / len(wins):6.1%} [{lo:.0%}-{hi:.0%}]"


# -- the arms -----------------------------------------------------------------------------------------------
class Study:
    def __init__(self, workdir: Path, fresh: bool = False):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.cache_file = workdir / "results.json"
        self.results = {} if fresh or not self.cache_file.exists() else json.loads(self.cache_file.read_text())
        self._backend = None

    def save(self) -> None:
        tmp = self.cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1))
        tmp.replace(self.cache_file)

    @property
    def backend(self):
        if self._backend is None:
            from agent_runtime.llm import make_backend

            self._backend = make_backend(study_config().model, seed=0)
        return self._backend

    def acting_with(self, adapter: str | None):
        """The policy with `adapter` (a directory) switched in, or the base model."""
        from types import SimpleNamespace

        from agent_runtime.llm.base import activate

        activate(self.backend, SimpleNamespace(name=Path(adapter).name, path=adapter) if adapter else None)
        return self.backend

    def cached(self, key: str, compute):
        if key not in self.results:
            started = time.perf_counter()
            self.results[key] = compute()
            self.save()
            print(f"  {key}: done in {time.perf_counter() - started:.0f}s", flush=True)
        return self.results[key]

    def evaluate(
        self, key: str, *, lessons=(), adapter: str | None = None, env=ENV, policy=None, split: str = "eval"
    ) -> list[bool]:
        """Won/lost per held-out task (ordered by seed), for one condition (`split="train"`: the train games)."""
        from agent_runtime.config import EnvEntry
        from agent_runtime.evaluation import evaluate

        def compute():
            config = study_config().model_copy(update={"envs": [EnvEntry.model_validate(env)]})
            backend = policy or self.acting_with(adapter)
            [result] = evaluate(config, self.workdir, backend, lessons=list(lessons), split=split)
            return [bool(e["won"]) for e in result.episodes]

        return self.cached(key, compute)

    def play(
        self, store, run_id: int, seed: int, lessons: list[str], adapter: str | None, draws: range, explore: float = 0.0
    ) -> list[int]:
        """Train episodes the way the loop's PLAY has them (sampled at the model's temperature, `explore` of the
        decisions drawn uniformly: `agent.explore`), into the store."""
        from agent_runtime.episode.build import build_envs, build_prompt_builders
        from agent_runtime.episode.runner import EpisodeContext, EpisodeRunner, TaskSampler
        from agent_runtime.llm.base import SamplingParams

        config = study_config(seed)
        backend = self.acting_with(adapter)
        specs, tasks = build_envs(config, self.workdir)
        sampler = TaskSampler([1.0], tasks, seed)
        queue = [sampler.draw(i) for i in draws]
        records = []
        runner = EpisodeRunner(
            backend,
            specs,
            build_prompt_builders(config, specs, backend),
            SamplingParams(max_new_tokens=12, temperature=0.7, seed=seed),
            slots=8,
            policy_name="smollm2",
            context_for=lambda draw: EpisodeContext(tuple(lessons)),
            explore=explore,
        )
        try:
            runner.run(lambda: queue.pop(0) if queue else None, records.append)
        finally:
            runner.close()
        return store.add_episodes(run_id, records)

    def train(
        self,
        key: str,
        store,
        run_id: int,
        seed: int,
        objective: str,
        parent: str | None = None,
        trainer: dict | None = None,
        lessons: list[str] | None = None,
        anchor: dict | None = None,
    ) -> dict:
        """One OPCD-style cycle's training on the run's newest episodes (the loop's CONSOLIDATE, by hand);
        `trainer` overrides fields of the cycle's trainer config; `lessons` the teacher's (default: the given one);
        `anchor` an env entry whose train games the parent plays for the anchor prompts (`opcd.anchor_envs`)."""
        from agent_runtime.checkpoints import resolve_model
        from agent_runtime.config import EnvEntry
        from agent_runtime.phases.consolidate import anchor_decisions
        from agent_runtime.phases.turn_prompts import episode_prefixes
        from agent_runtime.state import Run
        from distill.lessons.curate import render_lessons
        from distill.opcd import TrainJob, run_job

        def compute():
            config = study_config(seed, objective)
            run = Run(config, self.workdir, store, run_id)
            settings = config.opcd.trainer.model_copy(update=trainer or {})
            anchors = (
                []
                if anchor is None
                else anchor_decisions(
                    run,
                    self.acting_with(parent),
                    [EnvEntry.model_validate(anchor)],
                    ANCHOR_EPISODES,
                    choice_mode=True,
                )
            )
            decisions = [d for d in episode_prefixes(run, self.backend, TRAIN_EPISODES) if d.choices]
            out = self.workdir / "adapters" / key.replace(":", "-")
            context = render_lessons(lessons or [GIVEN])
            job = TrainJob(
                model_path=resolve_model("smollm2-135m-instruct"),
                config=settings,
                train_prompts=[d.chat for d in decisions],
                train_choices=[d.choices for d in decisions],
                contexts=context,
                output=str(out),
                parent_adapter=parent,
                overwrite=True,
                anchor_prompts=[d.chat for d in anchors],
                anchor_choices=[d.choices for d in anchors] if anchors else None,
                kl_sets={"train": ([d.chat for d in decisions[:16]], context)},
                kl_choices={"train": [d.choices for d in decisions[:16]]},
            )

            def show(m: dict) -> None:
                val = f" val {m['val_kl']:.4f}" if m.get("val_kl") is not None else ""
                print(f"    step {m['step']} loss {m['loss']:.4f}{val} ({m['seconds']:.1f}s)", flush=True)

            result = run_job(job, on_step=show)
            return {
                "adapter": str(out),
                "decisions": len(decisions),
                "seconds": result.seconds,
                "kl_before": result.kl_before["train"],
                "kl_after": result.kl_after["train"],
                "losses": [m["loss"] for m in result.steps],
                "validation": result.validation,
                "best_step": result.best_step,
                "steps": len(result.steps),
                "anchors": len(anchors),
            }

        return self.cached(key, compute)

    def run(self) -> None:
        from agent_runtime.phases.cycle_evaluation import random_policy
        from agent_runtime.phases.extract import run_extract
        from agent_runtime.state import Run
        from distill.lessons import extraction_stats, live_lessons
        from memory import ExperienceStore

        print("held-out conditions without training", flush=True)
        self.evaluate("random", policy=random_policy(study_config()))
        self.evaluate("base")
        self.evaluate("given", lessons=[GIVEN])
        self.evaluate("harmful", lessons=[GIVEN, HARMFUL])
        self.evaluate("retention:base", env=RETENTION)
        self.evaluate("retention:random", env=RETENTION, policy=random_policy(study_config()))
        self.evaluate("level1:base", env=LEVEL1)
        self.evaluate("level1:random", env=LEVEL1, policy=random_policy(study_config()))
        for seed in SEEDS:
            print(f"seed {seed}", flush=True)
            db = self.workdir / f"seed-{seed}.db"
            if f"own:{seed}:lessons" not in self.results:  # the seed's experience was not completed: replay it
                for stale in db.parent.glob(db.name + "*"):
                    stale.unlink()
            with ExperienceStore.open(db, embedder="hash") as store:
                run = store.find_run(f"learning-study-{seed}")
                run_id = (
                    run.id
                    if run
                    else store.create_run(f"learning-study-{seed}", study_config(seed).model_dump(mode="json"))
                )
                if f"own:{seed}:lessons" not in self.results:
                    own = self.play(store, run_id, seed, [], None, range(TRAIN_EPISODES))
                    self.play(store, run_id, seed, [GIVEN], None, range(TRAIN_EPISODES, 2 * TRAIN_EPISODES))
                    run_extract(Run(study_config(seed), self.workdir, store, run_id), self.backend, own)
                    self.results[f"own:{seed}:lessons"] = [x.text for x in live_lessons(store, run_id)[1]]
                    self.results[f"own:{seed}:stats"] = extraction_stats(store, run_id).to_dict()
                    self.save()
                self.evaluate(f"own:{seed}", lessons=self.results[f"own:{seed}:lessons"])
                for objective in OBJECTIVES:
                    trained = self.train(f"{objective}:{seed}", store, run_id, seed, objective)
                    self.evaluate(f"{objective}:{seed}:without", adapter=trained["adapter"])
                    if objective == "opcd":
                        self.evaluate(f"{objective}:{seed}:retention", adapter=trained["adapter"], env=RETENTION)
                if seed == SEEDS[0]:
                    parent = self.results[f"opcd:{seed}"]["adapter"]
                    for cycle in (2, 3):
                        key = f"cycle{cycle}:{seed}"
                        if key not in self.results:
                            start = TRAIN_EPISODES * cycle
                            self.play(store, run_id, seed, [GIVEN], parent, range(start, start + TRAIN_EPISODES))
                        parent = self.train(key, store, run_id, seed, "opcd", parent=parent)["adapter"]
                        self.evaluate(f"{key}:without", adapter=parent)
                        self.evaluate(f"{key}:given", adapter=parent, lessons=[GIVEN])
        self.evaluate("opcd:0:given", adapter=self.results["opcd:0"]["adapter"], lessons=[GIVEN])


# -- the report ---------------------------------------------------------------------------------------------
def report(results: dict) -> str:
    from distill.lessons.gate import decide_gate

    base, given = results["base"], results["given"]
    lines = ["| arm | held-out success (n=40, 95% CI) | vs base: diff, McNemar p | seeds |", "|---|---|---|---|"]

    def row(name: str, keys: list[str], against=base, note: str = "") -> None:
        runs = [results[k] for k in keys if k in results]
        if not runs:
            return
        pooled = [w for r in runs for w in r]
        diffs = [sum(r) / len(r) - sum(against) / len(against) for r in runs]
        ps = [mcnemar_p(against, r) for r in runs]
        spread = f" (per seed {', '.join(f'{sum(r) / len(r):.0%}' for r in runs)})" if len(runs) > 1 else ""
        lines.append(
            f"| {name} | {rate(pooled)}{spread} | {statistics.fmean(diffs):+.1%}, "
            f"p {'/'.join(f'{p:.2g}' for p in ps)}{note} | {len(runs)} |"
        )

    row("random admissible", ["random"])
    row("base (no lessons)", ["base"])
    row("given lesson in context", ["given"])
    row("own extracted lessons in context", [f"own:{s}" for s in SEEDS])
    for objective, label in (
        ("opcd", "OPCD student, no lessons"),
        ("off_policy", "off-policy CD, no lessons"),
        ("sft", "SFT on teacher choices, no lessons"),
    ):
        row(label, [f"{objective}:{s}:without" for s in SEEDS])
    row("harmful lesson added to the given one", ["harmful"])
    out = ["## Learning study (bench/learning.py)", "", "\n".join(lines), ""]

    gains = []
    for s in SEEDS:
        key = f"opcd:{s}:without"
        if key in results and sum(given) != sum(base):
            gains.append((sum(results[key]) - sum(base)) / (sum(given) - sum(base)))
    if gains:
        shown = ", ".join(f"{g:.0%}" for g in gains)
        out.append(
            f"Gain kept by OPCD (student without lessons - base) / (given - base): {shown} over "
            f"{len(gains)} seeds, mean {statistics.fmean(gains):.0%}."
        )
    compare = []
    for objective in ("off_policy", "sft"):
        for s in SEEDS:
            a, b = results.get(f"opcd:{s}:without"), results.get(f"{objective}:{s}:without")
            if a and b:
                compare.append(f"{objective} seed {s}: {sum(b) - sum(a):+d} tasks vs OPCD (p {mcnemar_p(a, b):.2g})")
    if compare:
        out.append("Same budget, paired against OPCD: " + "; ".join(compare) + ".")
    gate = decide_gate(given, results["harmful"], margin=0.05)
    out.append(f"Lesson gate on the harmful candidate: {gate.reason}.")
    for s in SEEDS:
        if f"own:{s}" in results:
            own_gate = decide_gate(base, results[f"own:{s}"], margin=0.05)
            out.append(f"Lesson gate on the agent's own lessons, seed {s} (current: none): {own_gate.reason}.")
    if "level1:base" in results:
        out.append(
            f"Choice mode where the base model needs no lesson (coin-collector level 1, first decision, "
            f"n=40): random {rate(results['level1:random'])}, base {rate(results['level1:base'])}, "
            f"McNemar p {mcnemar_p(results['level1:random'], results['level1:base']):.2g}."
        )
    ret = [results["retention:base"]] + [
        results[f"{o}:{s}:retention"] for o in OBJECTIVES for s in SEEDS if f"{o}:{s}:retention" in results
    ]
    out.append(
        f"Retention (treasure-hunter level 1, 1 step, n=40, not trained on): random "
        f"{rate(results['retention:random'])}, base {rate(ret[0])}; after training: "
        + ", ".join(
            f"{o} {rate([w for s in SEEDS for w in results.get(f'{o}:{s}:retention', [])])}"
            for o in OBJECTIVES
            if f"{o}:0:retention" in results
        )
        + "."
    )
    curve = [("base", base)] + [
        (f"cycle {c}", results[k])
        for c, k in ((1, "opcd:0:without"), (2, "cycle2:0:without"), (3, "cycle3:0:without"))
        if k in results
    ]
    out.append(
        "Cycles in a row (seed 0), success without lessons: "
        + " -> ".join(f"{name} {sum(w) / len(w):.0%}" for name, w in curve)
        + "."
    )
    for s in SEEDS:
        stats = results.get(f"own:{s}:stats")
        if stats:
            out.append(
                f"Own lessons, seed {s}: {results[f'own:{s}:lessons']} "
                f"(extraction stats: {json.dumps(stats, default=str)[:300]})"
            )
    return "\n".join(out) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [
        ("random", ["random"]),
        ("base", ["base"]),
        ("given\nlesson", ["given"]),
        ("own\nlessons", [f"own:{s}" for s in SEEDS]),
        ("OPCD", [f"opcd:{s}:without" for s in SEEDS]),
        ("off-policy", [f"off_policy:{s}:without" for s in SEEDS]),
        ("SFT", [f"sft:{s}:without" for s in SEEDS]),
        ("harmful", ["harmful"]),
    ]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [2.2, 1]})
    for i, (label, keys) in enumerate(arms):
        runs = [results[k] for k in keys if k in results]
        if not runs:
            continue
        wins = [w for r in runs for w in r]
        p = sum(wins) / len(wins)
        lo, hi = wilson_interval(sum(wins), len(wins))
        left.bar(i, p, color="#4c72b0" if "lesson" not in label else "#55a868")
        left.errorbar(i, p, yerr=[[p - lo], [hi - p]], color="black", capsize=3)
        for r in runs if len(runs) > 1 else []:
            left.plot(i, sum(r) / len(r), "o", color="white", markeredgecolor="black", markersize=4)
    left.set_xticks(range(len(arms)), [a for a, _ in arms], fontsize=8)
    left.set_ylabel("held-out success (n=40/seed)")
    left.set_ylim(0, 1)
    left.set_title("coin-collector L2, 3 steps: arms with 95% CI (dots: seeds)", fontsize=9)
    curve = [results.get(k) for k in ("base", "opcd:0:without", "cycle2:0:without", "cycle3:0:without")]
    curve = [c for c in curve if c]
    xs = list(range(len(curve)))
    ps = [sum(c) / len(c) for c in curve]
    bounds = [wilson_interval(sum(c), len(c)) for c in curve]
    right.fill_between(xs, [b[0] for b in bounds], [b[1] for b in bounds], alpha=0.25)
    right.plot(xs, ps, "o-", label="without lessons")
    right.axhline(sum(results["given"]) / len(results["given"]), ls="--", color="#55a868", label="base + lesson")
    right.axhline(sum(results["random"]) / len(results["random"]), ls=":", color="gray", label="random")
    right.set_xticks(xs, ["base", "cycle 1", "cycle 2", "cycle 3"][: len(xs)], fontsize=8)
    right.set_ylim(0, 1)
    right.set_title("OPCD cycles in a row (seed 0)", fontsize=9)
    right.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/agent-runtime/learning-study")
    parser.add_argument("--report", action="store_true", help="only print the table and draw the plot from the cache")
    parser.add_argument("--fresh", action="store_true", help="forget cached results")
    args = parser.parse_args(argv)
    study = Study(args.workdir, fresh=args.fresh)
    if not args.report:
        study.run()
    text = report(study.results)
    print(text)
    (HERE / "learning.md").write_text(text)
    plot(study.results, HERE / "learning.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
