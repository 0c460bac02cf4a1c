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
    .venv/bin/python bench/long_lived.py report --seeds 0,1,2 --plot docs/long-lived.svg   # the README's picture

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
from agent_runtime.evaluation.matrix import load_matrix
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
        "labels": matrix.phases[: matrix.rows],
        "rates": {e: [matrix.rate(i, e) for i in range(matrix.rows)] for e in matrix.envs},
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


COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def plot_svg(rows: list[dict], width: int = 720, height: int = 260) -> str:
    """Each family's held-out success over the rounds: one thin line per seed and a thick one for the mean over
    seeds, the rounds' labels below. `rows`: what `report_seed` returns (its `labels` and `rates`)."""
    from html import escape

    labels = max((r["labels"] for r in rows), key=len)
    envs = list(rows[0]["rates"])
    pad, top, bottom = 40, 16, 56
    step = (width - 2 * pad) / max(len(labels) - 1, 1)

    def xy(i: int, rate: float) -> str:
        return f"{pad + step * i:.1f},{top + (height - top - bottom) * (1 - rate):.1f}"

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="10">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for tick in (0.0, 0.5, 1.0):
        y = top + (height - top - bottom) * (1 - tick)
        out.append(f'<line x1="{pad}" y1="{y:.1f}" x2="{width - pad}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="4" y="{y + 3:.1f}">{tick:.0%}</text>')
    for i, label in enumerate(labels):
        x = pad + step * i
        out.append(
            f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="end" transform="rotate(-40 {x:.1f} '
            f'{height - bottom + 14})">{escape(label)}</text>'
        )
    for k, env in enumerate(envs):
        colour = COLOURS[k % len(COLOURS)]
        for row in rows:
            points = " ".join(xy(i, r) for i, r in enumerate(row["rates"].get(env, [])) if r is not None)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-opacity="0.3" points="{points}"/>')
        means = []
        for i in range(len(labels)):
            seen = [
                r["rates"][env][i] for r in rows if i < len(r["rates"].get(env, [])) and r["rates"][env][i] is not None
            ]
            if seen:
                means.append(xy(i, statistics.fmean(seen)))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2.5" points="{" ".join(means)}"/>')
        out.append(
            f'<text x="{pad + 8 + 150 * k}" y="{height - 6}" fill="{colour}">&#9632; '
            f"{escape(env.rsplit('/', 1)[-1])}</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def report(root: Path, seeds: list[int], plot: Path | None = None) -> None:
    rows, every = [], []
    for seed in seeds:
        workdir = root / f"s{seed}"
        if (workdir / "memory.db").exists():
            result = report_seed(workdir, seed)
            if result is not None:
                every.append(result)
                if result["complete"]:
                    rows.append(result)
    if plot is not None and every:
        plot.write_text(plot_svg(every))
        print(f"the curves of {len(every)} seed(s) written to {plot}")
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
    parser.add_argument("--plot", type=Path, help="write each family's curve over the rounds (SVG) here")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.what == "run":
        for seed in seeds:
            run(seed, args.workdir)
    report(args.workdir, seeds, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
