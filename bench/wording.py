"""Which words does the 135M model act on? (the wording of induced lessons)

The same finding can be written many ways; at 135M parameters the wording decides whether the model acts on it.
This plays lesson sets in context on 40 TRAIN games of coin-collector level 2 (3 steps; the train split, so the
held-out games of the learning study stay untouched by the choice of template), greedy, SmolLM2-135M on CPU,
choice mode, and compares each with no lesson, paired on the same games (McNemar).

    .venv/bin/python bench/wording.py                 # every set below (cached: rerun prints the table)
    .venv/bin/python bench/wording.py --sets 0 3 9    # some of them

Results are cached beside the learning study's (`<workdir>/results.json`, keys `wording:<the lessons as JSON>`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import ENV, Study, rate

from distill.lessons.gate import mcnemar_p

GAMES = 40
TRAIN_ENV = {**ENV, "kwargs": {**ENV["kwargs"], "n_train": GAMES}}
SETS: list[tuple[str, list[str]]] = [
    ("no lesson", []),
    ("a person's lesson", ["Go through the exit. Look and inventory never help. When you see a coin, take coin."]),
    ("induced, old wording", ["Start with go.", "Look never helps.", "When you can take coin, take coin."]),
    ("old prefer, person's go", ["Go through the exit.", "Look never helps.", "When you can take coin, take coin."]),
    ("old start alone", ["Start with go."]),
    ("person's go alone", ["Go through the exit."]),
    ("induced, new wording", ["Go first.", "Look never helps.", "When you see a coin, take coin."]),
    ("old start, new prefer", ["Start with go.", "Look never helps.", "When you see a coin, take coin."]),
    ("new start, old prefer", ["Go first.", "Look never helps.", "When you can take coin, take coin."]),
    (
        "new wording, look and inventory",
        ["Go first.", "Look and inventory never help.", "When you see a coin, take coin."],
    ),
    ("new wording without avoid", ["Go first.", "When you see a coin, take coin."]),
    ("new wording, avoid first", ["Look never helps.", "Go first.", "When you see a coin, take coin."]),
    (
        "new wording + repeat",
        [
            "Go first.",
            "Look never helps.",
            "When you see a coin, take coin.",
            "If an action changed nothing, choose another one.",
        ],
    ),
    ("'Always go first.'", ["Always go first.", "Look never helps.", "When you see a coin, take coin."]),
    ("'Go first, always.'", ["Go first, always.", "Look never helps.", "When you see a coin, take coin."]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/agent-runtime/learning-study")
    parser.add_argument("--sets", nargs="*", type=int, default=list(range(len(SETS))))
    args = parser.parse_args()

    study = Study(args.workdir)
    indexes = sorted({0, *args.sets})
    wins = {
        i: study.evaluate(f"wording:{json.dumps(SETS[i][1])}", lessons=SETS[i][1], env=TRAIN_ENV, split="train")
        for i in indexes
    }
    base = wins[0]
    print(f"\n{GAMES} train games of coin-collector level 2 (3 steps), greedy, SmolLM2-135M, choice mode\n")
    print("| lesson set | wins | success [95% CI] | McNemar p vs no lesson |")
    print("|---|---|---|---|")
    for index in indexes:
        name, lessons = SETS[index]
        shown = " ".join(lessons) or "(none)"
        p = "" if not lessons else f"{mcnemar_p(base, wins[index]):.2g}"
        print(f"| {name}: {shown} | {sum(wins[index])}/{GAMES} | {rate(wins[index])} | {p} |")


if __name__ == "__main__":
    main()
