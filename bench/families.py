"""The search for a second environment family: where does a person's lesson in context raise
SmolLM2-135M's success?

A consolidation study needs a family where the base model is not near 100% and a lesson helps in context: a cycle can
only keep a gain that the lesson gives. Coin-collector level 2 is one such family (base 5-8%, below random play, and the
lesson 42-52%). A candidate qualifies when a lesson raises success on the same tasks (McNemar p < 0.05) and the base
wins at most 80%. This plays every candidate below on its TRAIN split (40 games or problems, the held-out games stay
untouched by the search), greedy, SmolLM2-135M on CPU, the learning study's agent settings (choice mode where the game
lists its actions, free text otherwise): the base model without lessons, a uniformly random admissible action where
there is a set, and each lesson, paired with the base on the same tasks (McNemar).

    .venv/bin/python bench/families.py                      # every candidate (cached: a rerun prints the table)
    .venv/bin/python bench/families.py --only alfworld math # some of them (names start with these)

Results are cached in `<workdir>/results.json` (keys `family:<the env as JSON>:<arm>`; the default workdir is
its own, so the search can run beside the learning study).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import GIVEN, Study, rate, study_config

from distill.lessons.gate import mcnemar_p

GAMES = 40


def _env(env_id: str, max_steps: int, **kwargs) -> dict:
    return {"id": env_id, "kwargs": {**kwargs, "n_train": GAMES, "n_eval": GAMES}, "max_steps": max_steps}


def _own_folds(env_id: str, max_steps: int, **kwargs) -> dict:
    """An environment whose tasks are its framework's own folds (TWX, ScienceWorld): the first 40 train tasks."""
    return {"id": env_id, "kwargs": kwargs, "max_steps": max_steps}


# (name, env, max_new_tokens for a free-text family (None: choice mode, the study's 12), lessons to try)
CANDIDATES: list[tuple[str, dict, int | None, list[str]]] = [
    (
        "coin-collector L2 (the study's family, for reference)",
        _env("textworld/coin_collector", 3, level=2),
        None,
        [GIVEN],
    ),
    (
        "treasure-hunter L1, 1 step",
        _env("textworld/treasure_hunter", 1, level=1),
        None,
        [
            "The object you must find is already in the room. Take it.",
            "Reply take and the name of the object in your task.",
        ],
    ),
    (
        "treasure-hunter L3, 4 steps",
        _env("textworld/treasure_hunter", 4, level=3),
        None,
        [
            "Go through an exit, then take the object your task names.",
            (
                "Go through the exit. Look, examine and inventory never help. When you see the object your task names, "
                "take it."
            ),
            "Never look, examine or check your inventory.",
        ],
    ),
    (
        "custom, 1 room, one-action quest, 2 steps",
        _env("textworld/custom", 2, nb_rooms=1, nb_objects=4, quest_length=1),
        None,
        [
            "Examine, look and inventory never help.",
            "Do what your task asks in one action. Examine, look and inventory never help.",
            "Choose the action that names the objects of your task. Never examine.",
            "Shut means close. Ditch means drop. Rest on means put on. Examine never helps.",
        ],
    ),
    (
        "custom, 2 rooms, one-action quest, 2 steps",
        _env("textworld/custom", 2, nb_rooms=2, nb_objects=4, quest_length=1),
        None,
        ["Stay in this room: what your task names is here. Never go, examine or look."],
    ),
    (
        "cooking, 1 ingredient, 1 room, 6 steps",
        _env("textworld/cooking", 6, recipe=1, take=1, go=1),
        None,
        ["Take the ingredient, then prepare meal, then eat meal."],
    ),
    (
        "FrozenLake 3x3, 2 holes, 5 steps",
        _env("textarena/frozenlake", 5),
        None,
        ["Move down twice and right twice, never into a hole.", "Alternate: down, right, down, right."],
    ),
    (
        "Sokoban 6x6, 1 box, 5 steps",
        _env("textarena/sokoban", 5),
        None,
        [
            "Stand behind the box and push it towards the goal.",
            "Walk to the box, then keep moving the same way to push it onto the goal.",
            "Never move away from the box.",
        ],
    ),
    (
        "ALFWorld pick-and-place (generated), 8 steps",
        _env("alfworld/text", 8, task_types=["pick_and_place_simple"]),
        None,
        ["Go to where the object is, take it, go to the target, then move it there."],
    ),
    # TextWorld Express with TALES' parameters, and ScienceWorld's easiest tasks; lessons written before
    # measuring
    ("TWX coin, 4 steps", _own_folds("twx/coin", 4), None, ["Take the coin. Look and inventory never help."]),
    (
        "TWX TextWorld Commonsense, 4 steps",
        _own_folds("twx/twc", 4),
        None,
        [
            "Take the item that is out of place, then put it where it belongs.",
            "Never examine, look or check your inventory: take the misplaced item and put it away.",
        ],
    ),
    (
        "TWX arithmetic, 6 steps",
        _own_folds("twx/arithmetic", 6),
        None,
        ["Take the math problem and read it. Then take the item whose quantity is the answer and put it in the box."],
    ),
    (
        "TWX sorting, 12 steps",
        _own_folds("twx/sorting", 12),
        None,
        ["Take the item with the smallest quantity and put it in the box; repeat with the next smallest."],
    ),
    (
        "TWX Simon Says 10, 12 steps",
        _own_folds("twx/simonsays", 12),
        None,
        ["Do exactly what Simon says: choose the action Simon names, word for word."],
    ),
    (
        "TWX pecking order, 10 steps",
        _own_folds("twx/peckingorder", 10),
        None,
        ["Read the instructions book, do the one thing it says, then read it again."],
    ),
    (
        "TWX map reader, 12 steps",
        _own_folds("twx/mapreader", 12),
        None,
        ["Read the map first. Then go to the room with the coin, take it, come back and put it in the box."],
    ),
    (
        "TWX cooking world, 12 steps",
        _own_folds("twx/cookingworld", 12),
        None,
        ["Take the cookbook and read it, then take each ingredient it names, prepare meal, then eat meal."],
    ),
    (
        "ScienceWorld find a plant, free text, 12 steps",
        _own_folds("scienceworld/find-plant", 12, admissible_actions=False),
        16,
        ["Open the door to outside and go outside, where plants grow. Focus on a plant, then move it to the box."],
    ),
    (
        "ScienceWorld find a living thing, free text, 12 steps",
        _own_folds("scienceworld/find-living-thing", 12, admissible_actions=False),
        16,
        [
            "Open the door to outside and go outside, where animals and plants live. Focus on one, then move it to the box."
        ],
    ),
    (
        "ScienceWorld find an animal, free text, 12 steps",
        _own_folds("scienceworld/find-animal", 12, admissible_actions=False),
        16,
        ["Open the door to outside and go outside, where animals live. Focus on an animal, then move it to the box."],
    ),
    (
        "GSM-Symbolic, free text, 256 tokens",
        _env("math/gsm_symbolic", 1),
        256,
        [
            "End with the final number inside \\boxed{}.",
            "Compute step by step with short sentences, then write \\boxed{answer}.",
        ],
    ),
]


def selected(name: str, only: list[str] | None) -> bool:
    """Whether the candidate `name` is one of `--only`'s (names starting with one of its words; all without)."""
    return not only or any(name.lower().startswith(o.lower()) for o in only)


def key(env: dict, arm: str) -> str:
    return f"family:{json.dumps(env, sort_keys=True)}:{arm}"


def play(study: Study, env: dict, max_new_tokens: int | None, arm: str, lessons: list[str]) -> list[bool]:
    """Won/lost per train task of `env` (ordered by seed): the base model with `lessons`, or the random policy."""
    from agent_runtime.config import EnvEntry
    from agent_runtime.evaluation import evaluate
    from agent_runtime.phases.cycle_evaluation import random_policy

    def compute():
        config = study_config()
        model = config.model.model_copy(update={"max_new_tokens": max_new_tokens}) if max_new_tokens else config.model
        config = config.model_copy(update={"envs": [EnvEntry.model_validate(env)], "model": model})
        policy = random_policy(config) if arm == "random" else study.acting_with(None)
        [result] = evaluate(config, study.workdir, policy, lessons=lessons, split="train", episodes_per_env=GAMES)
        return [bool(e["won"]) for e in result.episodes]

    return study.cached(key(env, arm), compute)


def report(results: dict, only: list[str] | None = None) -> str:
    lines = [
        (
            "| candidate (40 train tasks, greedy) | base | random admissible | lesson in context: rate, "
            "difference, McNemar p | a second family? |"
        ),
        "|---|---|---|---|---|",
    ]
    for name, env, _, lessons in CANDIDATES:
        if not selected(name, only):
            continue
        base = results.get(key(env, "base"))
        if base is None:
            continue
        rand = results.get(key(env, "random"))
        cells, best = [], None
        for text in lessons:
            won = results.get(key(env, json.dumps([text])))
            if won is None:
                continue
            p = mcnemar_p(base, won)
            cells.append(f'"{text}" {sum(won) / len(won):.0%} ({sum(won) - sum(base):+d} tasks, p {p:.2g})')
            if sum(won) > sum(base) and p < 0.05:
                best = text
        share = sum(base) / len(base)
        verdict = (
            f"no: base {share:.0%}, no room to gain"
            if share > 0.8
            else f'yes: "{best}"'
            if best
            else "no: no lesson raised it (p < 0.05)"
        )
        lines.append(
            f"| {name} | {rate(base)} | {rate(rand) if rand else 'free text'} | {'; '.join(cells)} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/agent-runtime/families")
    parser.add_argument("--only", nargs="*", help="candidates whose names start with these words")
    parser.add_argument("--report", action="store_true", help="only print the table from the cache")
    args = parser.parse_args(argv)
    study = Study(args.workdir)
    if not args.report:
        for name, env, tokens, lessons in CANDIDATES:
            if not selected(name, args.only):
                continue
            started = time.perf_counter()
            print(f"{name}", flush=True)
            play(study, env, tokens, "base", [])
            if tokens is None:
                play(study, env, tokens, "random", [])
            for text in lessons:
                play(study, env, tokens, json.dumps([text]), [text])
            print(f"  {name}: {time.perf_counter() - started:.0f}s", flush=True)
    print(report(study.results, args.only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
