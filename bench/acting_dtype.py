"""Acting in bfloat16 against float32 on CPU, with and without a small OPCD adapter, on held-out games.

The transformers backend's `dtype: auto` used to act in bf16 on CPUs with native bf16 support and in float32
elsewhere, so the same seeded run gave different tables on different machines. This plays the learning study's
40 held-out coin-collector level-2 games (greedy, the same seeds) with the base model, the person's lesson in
context, and the adapters of bench/cycle_sweep.py, once in each dtype; the paired difference says what bf16
acting does to a small adapter's gain. (On a CPU without native bf16, bf16 is emulated: slower, same numbers.)

    .venv/bin/python bench/acting_dtype.py [--adapters KEY ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import ENV, GIVEN, rate, study_config

from distill.lessons.gate import mcnemar_p


def play(backend, workdir: Path, lessons: list[str]) -> list[bool]:
    from agent_runtime.config import EnvEntry
    from agent_runtime.evaluation import evaluate

    config = study_config().model_copy(update={"envs": [EnvEntry.model_validate(ENV)]})
    [result] = evaluate(config, workdir, backend, lessons=lessons)
    return [bool(e["won"]) for e in result.episodes]


def main(argv: list[str] | None = None) -> int:
    import json

    from agent_runtime.llm import make_backend
    from agent_runtime.llm.base import activate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/agent-runtime/learning-study")
    parser.add_argument("--adapters", nargs="*", default=None, help="result keys of bench/cycle_sweep.py")
    args = parser.parse_args(argv)
    results = json.loads((args.workdir / "results.json").read_text())
    keys = (
        args.adapters
        if args.adapters is not None
        else [k for k in results if k.startswith("sweep:") and k.count(":") == 2][:3]
    )
    conditions = [("base", None, []), ("lesson in context", None, [GIVEN])]
    conditions += [(f"adapter {k}", results[k]["adapter"], []) for k in keys]
    rows = {}
    for dtype in ("float32", "bfloat16"):
        model = study_config().model.model_copy(update={"dtype": dtype})
        backend = make_backend(model, seed=0)
        for name, adapter, lessons in conditions:
            activate(backend, SimpleNamespace(name=Path(adapter).name, path=adapter) if adapter else None)
            rows.setdefault(name, {})[dtype] = play(backend, args.workdir, lessons)
            print(f"  {dtype} {name}: {rate(rows[name][dtype])}", flush=True)
    print("| condition (40 held-out games) | float32 | bfloat16 | bf16 - fp32, McNemar p |")
    print("|---|---|---|---|")
    for name, by in rows.items():
        a, b = by["float32"], by["bfloat16"]
        print(f"| {name} | {rate(a)} | {rate(b)} | {(sum(b) - sum(a)) / len(a):+.1%}, p {mcnemar_p(a, b):.2g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
