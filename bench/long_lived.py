"""The long-lived study: configs/long-lived.yaml (twelve rounds, three TextWorld families that come back four times
each, the agent's own experience only) over several seeds, SmolLM2-135M on CPU, held-out games with fixed seeds.

Per seed: the matrix R over every round, ACC/BWT/FWT with their paired-bootstrap intervals, each family's course (its
base, best, end, largest drop below its best so far, lowest against its base after the phase that first trained it),
every round's line (lessons and tokens per family, drift from the base model, phase times, memory), and the targets:
  - no family more than 5 points below its base at any round after its first phase;
  - at the end, no family more than 5 points below its best so far;
  - final ACC >= the base model's ACC + 20 points; BWT >= 0;
  - round 12's time within 15% of round 3's; the peak resident memory flat within 5% from round 3 on.
Over seeds: each figure's mean with a t 95% interval.

    .venv/bin/python bench/long_lived.py run --seeds 0,1,2          # resumable: a finished seed is not run again
    .venv/bin/python bench/long_lived.py report --seeds 0,1,2

Runs live under `--workdir` (default bench-runs/long-lived), one folder per seed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_runtime.config import config_from_dict
from agent_runtime.evaluation.continual import load_matrix
from agent_runtime.evaluation.rounds import courses, courses_table, load_rounds
from bench.continual import run_config
from memory import ExperienceStore

T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def study_config(seed: int) -> dict:
    data = yaml.safe_load((ROOT / "configs" / "long-lived.yaml").read_text())
    return {**data, "seed": seed, "name": f"long-lived-s{seed}"}


def run(seed: int, root: Path) -> Path:
    return run_config(study_config(seed), root / f"s{seed}")


def _mean_t(values: list[float], scale: float = 100.0, sign: str = "+") -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean * scale:{sign}.1f}"
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean * scale:{sign}.1f} [{(mean - half) * scale:{sign}.1f}, {(mean + half) * scale:{sign}.1f}]"


def report_seed(workdir: Path, seed: int) -> dict | None:
    config = config_from_dict(study_config(seed))
    with ExperienceStore.open(workdir, read_only=True) as store:
        run_id = store.runs()[-1].id
        matrix = load_matrix(store, run_id, config.curriculum, [e.id for e in config.envs])
        rounds = load_rounds(store, run_id, matrix)
        cycles = [(c.id, c.status) for c in store.cycles(run_id)]
    minutes = (
        json.loads((workdir / "bench-seconds.json").read_text())["seconds"] / 60
        if (workdir / "bench-seconds.json").exists()
        else None
    )
    print(
        f"== seed {seed}: {matrix.rows - 1} of {len(matrix.phases) - 1} rounds"
        + (f", {minutes:.1f} min" if minutes else "")
    )
    print(matrix.table())
    print(courses_table(matrix))
    for record in rounds:
        print(record.line(matrix.envs))
    print("cycles: " + ", ".join(f"{i} {s}" for i, s in cycles))
    if matrix.rows < 2:
        return None
    fams = courses(matrix)
    base = statistics.fmean(matrix.rate(0, e) for e in matrix.envs)
    out = {
        "acc": matrix.acc()[0],
        "base": base,
        "bwt": matrix.bwt()[0],
        "fwt": matrix.fwt()[0],
        "below_base": min(
            (c.worst_below_base_after_learned for c in fams if c.worst_below_base_after_learned is not None),
            default=0.0,
        ),
        "below_best_at_end": max(c.drop_below_best_at_end for c in fams),
        "complete": matrix.complete(),
    }
    timed = [r for r in rounds if r.seconds]
    if len(timed) >= 12:
        third, last = timed[2], timed[11]
        out["time_ratio"] = sum(last.seconds.values()) / sum(third.seconds.values())
        out["peak_ratio"] = (last.peak_rss_mb or 0) / (third.peak_rss_mb or 1)
    checks = [
        ("no family > 5 points below its base after its first phase", out["below_base"] >= -0.05 - 1e-9),
        ("no family > 5 points below its best at the end", out["below_best_at_end"] <= 0.05 + 1e-9),
        ("final ACC >= base ACC + 20 points", out["acc"] is not None and out["acc"] >= base + 0.20 - 1e-9),
        ("BWT >= 0", out["bwt"] is not None and out["bwt"] >= 0),
    ]
    if "time_ratio" in out:
        checks.append(
            (f"round 12's time within 15% of round 3's ({out['time_ratio']:.2f}x)", out["time_ratio"] <= 1.15)
        )
        checks.append(
            (f"peak memory flat within 5% from round 3 ({out['peak_ratio']:.3f}x)", out["peak_ratio"] <= 1.05)
        )
    for what, ok in checks:
        print(f"  {'met   ' if ok else 'MISSED'} {what}")
    print()
    return out


def report(root: Path, seeds: list[int]) -> None:
    rows = []
    for seed in seeds:
        workdir = root / f"s{seed}"
        if (workdir / "memory.db").exists():
            result = report_seed(workdir, seed)
            if result is not None and result["complete"]:
                rows.append(result)
    if not rows:
        return
    print(f"over {len(rows)} complete seed(s), mean [t 95% CI], points:")
    print(
        f"  final ACC {_mean_t([r['acc'] for r in rows], sign='')}%; base ACC {_mean_t([r['base'] for r in rows], sign='')}%"
    )
    print(
        f"  ACC - base {_mean_t([r['acc'] - r['base'] for r in rows])}; BWT {_mean_t([r['bwt'] for r in rows])}; FWT {_mean_t([r['fwt'] for r in rows])}"
    )
    print(
        "  lowest against base after learned, per seed: "
        + ", ".join(f"{r['below_base'] * 100:+.0f}" for r in rows)
        + "; largest drop below best at the end: "
        + ", ".join(f"{r['below_best_at_end'] * 100:.0f}" for r in rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "report"))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench-runs" / "long-lived")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.what == "run":
        for seed in seeds:
            run(seed, args.workdir)
    report(args.workdir, seeds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
