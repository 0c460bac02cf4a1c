"""The sweep that picks the choice-mode cycle's trainer defaults (`opcd.trainer`), on held-out games.

Same setting, arms and statistics as bench/learning.py (TextWorld coin-collector level 2, 3 steps, 40 held-out
games with fixed seeds, greedy, SmolLM2-135M on CPU): for each seed the agent plays 16 train episodes with the
person's lesson in context (the loop's PLAY), and each trainer variant distils the lesson from the per-turn
prompts of those episodes (one cycle); the student is then played WITHOUT the lesson on the held-out games.
"Gain kept" is (student - base) / (lesson in context - base) on the same games.

    .venv/bin/python bench/cycle_sweep.py                       # every variant, seeds 0-2 (resumable)
    .venv/bin/python bench/cycle_sweep.py --variants full-1e-4 --seeds 0 1 2 3 4
    .venv/bin/python bench/cycle_sweep.py --variants old-b4-1e-4 --objectives off_policy sft --seeds 0 1 2
    .venv/bin/python bench/cycle_sweep.py --report

`--heldout-kl` measures each cached student's KL to the teacher (the base model with the lesson) on the held-out games:
on every turn of the teacher's greedy episodes on the 40 held-out games (prompts rebuilt without the lesson), the
exact reverse KL between the two choice policies, for the base model ("before") and each student ("after").
It goes to `<workdir>/heldout_kl.json` (a file of its own: it can run beside a sweep that writes results.json).

`--objectives` trains the same budget with off-policy distillation (forward KL to the teacher's choice
distribution) or SFT (cross-entropy on an action drawn from it) beside OPCD; `--retention` also plays each
student on the study's retention games (treasure-hunter level 1, 40 games, never trained on); `--anchor` makes each
cycle hold the student to its parent on learning.ANCHOR's games (`opcd.anchor_envs`; keys end in `+anchor`).

Results are cached with the learning study's (`<workdir>/results.json`, keys `sweep:<variant>:<seed>`, with
`@<objective>` after the variant for the other objectives).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import ANCHOR, GIVEN, OBJECTIVES, RETENTION, TRAIN_EPISODES, Study, rate, study_config

from distill.lessons.gate import mcnemar_p

# The previous default (a noisy step: 4 prompts, constant lr 1e-4, no validation) against steps that see every
# prompt (batch 64 > a cycle's ~40 prompts), learning rates, schedules and the validation split.
VARIANTS: dict[str, dict] = {
    "old-b4-1e-4": {"steps": 8, "batch_size": 4, "lr": 1e-4},
    "old-b4-1e-4-bf16": {"steps": 8, "batch_size": 4, "lr": 1e-4, "weights_dtype": "bfloat16"},  # trained in bf16
    "full-1e-4": {"steps": 8, "batch_size": 64, "lr": 1e-4},
    "full-3e-4": {"steps": 8, "batch_size": 64, "lr": 3e-4},
    "full-1e-3": {"steps": 8, "batch_size": 64, "lr": 1e-3},
    "full-3e-4-val": {"steps": 16, "batch_size": 64, "lr": 3e-4, "validation_fraction": 0.25, "patience": 4},
    "full-1e-3-val": {"steps": 16, "batch_size": 64, "lr": 1e-3, "validation_fraction": 0.25, "patience": 4},
    "b8-1e-4-val": {"steps": 12, "batch_size": 8, "lr": 1e-4, "validation_fraction": 0.2, "patience": 4},
    "b8-1e-4-warm": {
        "steps": 12,
        "batch_size": 8,
        "lr": 1e-4,
        "warmup_steps": 4,
        "lr_schedule": "cosine",
        "validation_fraction": 0.2,
        "patience": 4,
    },
}


def arm(variant: str, objective: str, anchor: bool = False, share: float | None = None) -> str:
    """The cache name of a variant trained with `objective` (OPCD's keeps the variant's bare name), `+anchor` when
    the cycle held the student to its parent on learning.ANCHOR's games (`opcd.anchor_envs`), followed by the
    anchors' share of each batch when it was fixed (`anchor_share`)."""
    suffix = ("+anchor" + (f"{share:g}" if share is not None else "")) if anchor else ""
    return (variant if objective == "opcd" else f"{variant}@{objective}") + suffix


def run(
    study: Study,
    variants: list[str],
    seeds: list[int],
    objectives: list[str] = ("opcd",),
    retention: bool = False,
    anchor: bool = False,
    share: float | None = None,
) -> None:
    from memory import ExperienceStore

    study.evaluate("base")
    study.evaluate("given", lessons=[GIVEN])
    if retention:
        study.evaluate("retention:base", env=RETENTION)
    for seed in seeds:
        db = study.workdir / f"sweep-seed-{seed}.db"
        with ExperienceStore.open(db, embedder="hash") as store:
            name = f"cycle-sweep-{seed}"
            run = store.find_run(name)
            if run is None:
                run_id = store.create_run(name, study_config(seed).model_dump(mode="json"))
                study.play(store, run_id, seed, [GIVEN], None, range(TRAIN_EPISODES))
            else:
                run_id = run.id
            for variant in variants:
                for objective in objectives:
                    key = f"sweep:{arm(variant, objective, anchor, share)}:{seed}"
                    print(f"{key}", flush=True)
                    study.train(
                        key,
                        store,
                        run_id,
                        seed,
                        objective,
                        trainer={**VARIANTS[variant], "seed": seed, "anchor_share": share},
                        anchor=ANCHOR if anchor else None,
                    )
                    study.evaluate(f"{key}:without", adapter=study.results[key]["adapter"])
                    if retention:
                        study.evaluate(f"{key}:retention", adapter=study.results[key]["adapter"], env=RETENTION)


def heldout_decisions(study: Study) -> list:
    """Every choice turn of the teacher's (base model + the lesson) greedy episodes on the held-out games (the
    study's evaluation of the "given" arm, its tasks and seeds), each prompt rebuilt without the lesson."""
    from agent_runtime.episode.build import build_envs, build_prompt_builders
    from agent_runtime.evaluation import evaluate
    from agent_runtime.phases.turn_prompts import turn_prefixes

    config = study_config()
    backend = study.acting_with(None)
    records = []
    evaluate(config, study.workdir, backend, lessons=[GIVEN], on_record=records.append)
    specs, _ = build_envs(config, study.workdir, split="eval")
    [without] = build_prompt_builders(config, specs, backend)
    return [d for r in sorted(records, key=lambda r: r.seed) for d in turn_prefixes(without, r.steps) if d.choices]


def heldout_kl(study: Study, keys: list[str]) -> dict[str, float]:
    """KL(student without the lesson || base model with it) on the held-out turns, per arm key ("base": before)."""
    import json
    from types import SimpleNamespace

    from agent_runtime.checkpoints import resolve_model
    from distill.lessons.curate import render_lessons
    from distill.opcd import OPCDTrainer
    from distill.opcd.job import load_model
    from distill.opcd.teacher import TeacherSpec, load_teacher

    path = study.workdir / "heldout_kl.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    todo = [k for k in ["base", *keys] if k not in done]
    if not todo:
        return done
    cached = study.workdir / "heldout_decisions.json"  # the teacher's turns, played once
    if cached.exists():
        decisions = [SimpleNamespace(**d) for d in json.loads(cached.read_text())]
    else:
        decisions = heldout_decisions(study)
        cached.write_text(json.dumps([{"chat": d.chat, "choices": d.choices} for d in decisions]))
    model_path = resolve_model("smollm2-135m-instruct")
    teacher = load_teacher(TeacherSpec(model=model_path), "cpu")
    settings = study_config().opcd.trainer
    context = render_lessons([GIVEN])
    scores: dict = {}  # the teacher's choice scores, the same for every student: computed once
    for key in todo:
        model, tokenizer = load_model(model_path)
        adapter = None if key == "base" else study.results[key]["adapter"]
        trainer = OPCDTrainer(model, tokenizer, settings, parent_adapter=adapter, teacher_model=teacher)
        trainer._teacher_choices = scores
        done[key] = trainer.evaluate_kl([d.chat for d in decisions], context, [d.choices for d in decisions])
        print(f"  held-out KL {key}: {done[key]:.4f} ({len(decisions)} turns)", flush=True)
        path.write_text(json.dumps(done, indent=1))
    return done


def report(results: dict, variants: list[str], kl: dict[str, float] | None = None) -> str:
    if "base" not in results or "given" not in results:
        return "nothing measured yet in this workdir: run the sweep without --report first"
    base, given = results["base"], results["given"]
    lines = [
        f"base {rate(base)}, lesson in context {rate(given)} (40 held-out games)",
        "",
        (
            "| variant | objective | trainer | seeds | student without lesson, pooled | per seed "
            "| gain kept per seed (mean) | vs base, McNemar p per seed | train KL before -> after | steps (best) "
            "| s/cycle |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    paired, retained = [], []
    for variant in variants:
        shares = sorted(
            {
                k.split(":")[1].split("+anchor", 1)[1]
                for k in results
                if k.startswith(f"sweep:{variant}") and "+anchor" in k
            }
        )
        for objective, anchored in itertools.product(OBJECTIVES, [None, *shares]):
            name = arm(variant, objective) + ("" if anchored is None else f"+anchor{anchored}")
            seeds = sorted(
                int(k.split(":")[2])
                for k in results
                if k.startswith(f"sweep:{name}:") and k.count(":") == 2 and f"{k}:without" in results
            )
            if not seeds:
                continue
            runs = [results[f"sweep:{name}:{s}:without"] for s in seeds]
            trained = [results[f"sweep:{name}:{s}"] for s in seeds]
            span = sum(given) - sum(base)
            gains = [(sum(r) - sum(base)) / span for r in runs] if span else []
            settings = ", ".join(f"{k} {v}" for k, v in VARIANTS[variant].items())
            kls = ", ".join(f"{t['kl_before']:.3f}->{t['kl_after']:.3f}" for t in trained)
            steps = ", ".join(f"{t.get('steps', '?')} ({t.get('best_step')})" for t in trained)
            shown = (
                objective
                if anchored is None
                else f"{objective} + anchors" + (f" ({anchored} of each batch)" if anchored else "")
            )
            lines.append(
                f"| {variant} | {shown} | {settings} | {len(seeds)} | {rate([w for r in runs for w in r])} | "
                f"{', '.join(f'{sum(r) / len(r):.0%}' for r in runs)} | "
                f"{', '.join(f'{g:.0%}' for g in gains)} ({statistics.fmean(gains):.0%}) | "
                f"{', '.join(f'{mcnemar_p(base, r):.2g}' for r in runs)} | "
                f"{kls} | {steps} | "
                f"{statistics.fmean(t['seconds'] for t in trained):.0f} |"
            )
            if name != variant:
                both = [s for s in seeds if f"sweep:{variant}:{s}:without" in results]
                if both:
                    diffs = [
                        sum(results[f"sweep:{name}:{s}:without"]) - sum(results[f"sweep:{variant}:{s}:without"])
                        for s in both
                    ]
                    ps = [
                        mcnemar_p(results[f"sweep:{variant}:{s}:without"], results[f"sweep:{name}:{s}:without"])
                        for s in both
                    ]
                    paired.append(
                        f"- {name} vs OPCD ({variant}), {len(both)} seeds: "
                        f"{', '.join(f'{d:+d}' for d in diffs)} tasks (mean {statistics.fmean(diffs):+.1f}); "
                        f"McNemar p {', '.join(f'{p:.2g}' for p in ps)}"
                    )
            kept = [results[f"sweep:{name}:{s}:retention"] for s in seeds if f"sweep:{name}:{s}:retention" in results]
            if kept and "retention:base" in results:
                retained.append(
                    f"- retention ({name}, treasure-hunter L1, 40 games): base "
                    f"{rate(results['retention:base'])}; students "
                    f"{', '.join(f'{sum(r) / len(r):.0%}' for r in kept)}, pooled "
                    f"{rate([w for r in kept for w in r])}"
                )
    held = []
    if kl and "base" in kl:
        for variant in variants:
            for objective in OBJECTIVES:
                name = arm(variant, objective)
                after = [
                    v
                    for _, v in sorted(
                        (int(k.rsplit(":", 1)[1]), v) for k, v in kl.items() if k.startswith(f"sweep:{name}:")
                    )
                ]
                if after:
                    fell = sum(v < kl["base"] for v in after)
                    held.append(
                        f"- held-out KL ({name}; teacher's turns on the 40 held-out games): before "
                        f"{kl['base']:.3f}, after {', '.join(f'{v:.3f}' for v in after)}; fell in "
                        f"{fell} of {len(after)}"
                    )
    return "\n".join(lines + [""] + paired + retained + held) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/agent-runtime/learning-study")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--objectives", nargs="*", default=["opcd"], choices=list(OBJECTIVES))
    parser.add_argument("--retention", action="store_true", help="also play each student on the retention games")
    parser.add_argument(
        "--anchor",
        action="store_true",
        help="each cycle holds the student to its parent on learning.ANCHOR's games (opcd.anchor_envs)",
    )
    parser.add_argument(
        "--anchor-share",
        type=float,
        default=None,
        help="with --anchor: the anchors' fixed share of every batch (opcd.trainer.anchor_share)",
    )
    parser.add_argument(
        "--heldout-kl",
        action="store_true",
        help="measure each cached student's KL to the teacher on the held-out games",
    )
    parser.add_argument("--report", action="store_true", help="only print the table from the cache")
    args = parser.parse_args(argv)
    study = Study(args.workdir)
    if not args.report and not args.heldout_kl:
        run(study, args.variants, args.seeds, args.objectives, args.retention, args.anchor, args.anchor_share)
    kl = None
    if args.heldout_kl:
        keys = [
            f"sweep:{arm(v, o)}:{s}"
            for v in args.variants
            for o in args.objectives
            for s in args.seeds
            if f"sweep:{arm(v, o)}:{s}" in study.results
        ]
        kl = heldout_kl(study, keys)
    elif (args.workdir / "heldout_kl.json").exists():
        import json

        kl = json.loads((args.workdir / "heldout_kl.json").read_text())
    print(report(study.results, args.variants, kl))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
