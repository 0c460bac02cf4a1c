"""Resident memory over hours of the own-experience loop: does anything grow?

    nice -n 10 .venv/bin/python bench/memory_soak.py --hours 6 --workdir bench-runs/memory-soak
    .venv/bin/python bench/memory_soak.py --report --workdir bench-runs/memory-soak    # redraw from what it sampled

What runs: `agent-runtime run configs/own-experience.yaml` as one subprocess, on and on (until `--hours` are up,
or sooner at `--episodes` played), with the model swapped for one that costs no compute, so that hours hold many
thousands of episodes:
- `--model scripted` (default): the package's scripted policy (a random admissible action), PLAY and EXTRACT as the
  config has them (evidence induction, each candidate tried on 24 train games), every episode, step and lesson into
  the store and its FAISS index; no OPCD cycle (a scripted policy has no weights to distil into);
- `--model tiny`: the tiny random model built in code (bench/soak.py's), so that every 16 episodes a real OPCD cycle
  trains a LoRA adapter, evaluates and promotes or rolls back, and the next PLAY acts with the promoted adapter.

Every `--sample-s` seconds (60) it reads the loop's resident set (VmRSS) and its anonymous part (RssAnon: heap and
tensors, not the pages of files mapped in), the sum over the loop and the processes it started (game processes,
the fork server), with the episodes committed so far, and appends the sample to `<workdir>/samples.csv` at once:
a soak that is killed keeps what it measured, and `--report` reads it.

The measure: the least-squares slope of the loop's resident set over the samples after `--warmup-min` minutes,
as a percentage of their mean per hour (the target: within 1% an hour), the same for the process tree, and the
resident set at the end of each hour. `--plot` draws both series (bench/memory_soak.png).

A soak shares its machine for hours. To measure something else on quiet cores meanwhile:

    .venv/bin/python bench/memory_soak.py --pause --workdir bench-runs/memory-soak     # SIGSTOP the loop
    .venv/bin/python bench/memory_soak.py --unpause --workdir bench-runs/memory-soak   # SIGCONT it

Only the loop is stopped, not its game processes: a game stopped mid-request would leave the loop's step timeout
to fire on resume; a game that answers while the loop is stopped has its answer read when the loop goes on. Each
pause is logged in `<workdir>/pauses.txt` (wall-clock times; `clock.txt` maps them onto the soak's clock), and the
report leaves paused time out: the samples taken while paused are dropped and the hours are the loop's running
hours, so that a pause neither flattens the slope nor counts toward the 6 hours.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script (bench/ first on the path): the root makes `bench` importable
from bench.soak import INIT_STD, TAG, Settings, prepare, proc_fields, proc_kb, tagged_pids

# anon_kb: the loop's RssAnon, its resident memory backed by no file (heap, tensors): a step in VmRSS that is not in
# it is code or data of a file mapped in (a library's pages touched for the first time), not something held.
# threads: the loop's threads (each may get a malloc arena of its own: a step with a new thread may be its arena)
FIELDS = ("seconds", "rss_kb", "tree_kb", "processes", "episodes", "anon_kb", "threads")


def soak_config(model: str, model_dir: Path, seed: int, overrides: list[str] = ()) -> dict:
    """configs/own-experience.yaml with the model swapped (the rest as a user runs it, or as `overrides` say)."""
    from agent_runtime.config import apply_overrides

    data = yaml.safe_load((ROOT / "configs" / "own-experience.yaml").read_text())
    data["name"] = f"memory-soak-{model}"
    data["seed"] = seed
    data["runtime"]["summary_every"] = 1000
    if model == "scripted":
        data["model"] = {"name": "scripted", "backend": "scripted"}
        data["opcd"]["enabled"] = False
    else:
        data["model"] = {"name": str(model_dir), "dtype": "float32", "max_new_tokens": 4, "temperature": 0.7}
        data["memory"] = {"embedder": "hash"}
    return apply_overrides(data, list(overrides))


def committed(workdir: Path, name: str) -> int:
    """Episodes the run has committed (a read-only look at its cursor; 0 before the run or its store exists)."""
    from memory import DatabaseOutdatedError, ExperienceStore, StoreUnavailableError

    try:
        store = ExperienceStore.open(workdir, read_only=True)
    except (StoreUnavailableError, DatabaseOutdatedError):
        return 0
    try:
        run = store.find_run(name)
        return int(run.state.get("episodes", 0)) if run is not None else 0
    finally:
        store.close()


def soak(
    workdir: Path,
    model: str,
    hours: float,
    sample_s: float,
    seed: int,
    overrides: list[str] = (),
    episodes: int | None = None,
) -> int:
    """Run the loop for `hours` (or until it has played `episodes` in this start), sampling into samples.csv;
    returns the loop's exit status."""
    cache = Path(os.environ.get("AGENT_RUNTIME_CACHE", Path.home() / ".cache" / "agent-runtime")) / "soak"
    settings = Settings(workdir=workdir, model_dir=cache / f"tiny-std{INIT_STD}", games_dir=cache / "games")
    if model == "tiny":
        prepare(settings)
    workdir.mkdir(parents=True, exist_ok=True)
    config = soak_config(model, settings.model_dir, seed, overrides)
    from agent_runtime.config import config_from_dict

    config_from_dict(config)  # a bad --set is refused here, before anything starts
    config_path = workdir / "soak.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    resume = (workdir / "memory.db").exists()
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        TAG: tag,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [sys.executable, "-m", "agent_runtime", "run", str(config_path), "--workdir", str(workdir)]
    cmd += ["--no-progress", "--episodes", str(episodes or 10**9), *(["--resume"] if resume else [])]
    samples = workdir / "samples.csv"
    offset = 0.0
    fields = FIELDS
    if samples.exists():  # a resumed soak goes on from where its clock stopped, in the columns its file has
        rows = read_samples(samples)
        offset = rows[-1]["seconds"] if rows else 0.0
        with samples.open() as f:
            fields = tuple(f.readline().strip().split(","))
    else:
        samples.write_text(",".join(FIELDS) + "\n")
    with (workdir / "loop.log").open("a") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    t0, deadline = time.monotonic(), time.monotonic() + hours * 3600
    # SIGTERM would end this process without its `finally` and leave the loop running on its own: raise instead
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    (workdir / "loop.pid").write_text(f"{proc.pid}\n")
    with (workdir / "clock.txt").open("a") as clock:  # this start's wall time and the soak clock it starts from
        clock.write(f"{time.time():.3f} {offset:.0f}\n")
    print(f"soak: pid {proc.pid}, {hours} h, sampling every {sample_s:.0f} s into {samples}", flush=True)
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(max(0.0, min(sample_s, deadline - time.monotonic())))  # the first sample after one interval
            if proc.poll() is not None:
                break
            own = proc_fields(proc.pid, "VmRSS", "RssAnon", "Threads")  # one read: one moment of the loop
            rss = own.get("VmRSS")
            pids = sorted({proc.pid, *tagged_pids(tag)})  # a process just started may not show its tag yet
            tree = sum(proc_kb(p, "VmRSS") or 0 for p in pids)
            episodes = committed(workdir, config["name"])
            t = offset + time.monotonic() - t0
            if rss is not None:
                row = {"seconds": f"{t:.0f}", "rss_kb": rss, "tree_kb": tree, "processes": len(pids)}
                row |= {"episodes": episodes, "anon_kb": own.get("RssAnon", 0), "threads": own.get("Threads", 0)}
                with samples.open("a") as out:
                    out.write(",".join(str(row[k]) for k in fields) + "\n")
                print(
                    f"{t / 60:6.1f} min  {episodes:7d} episodes  loop {rss / 1024:6.0f} MiB  tree "
                    f"{tree / 1024:6.0f} MiB ({len(pids)} processes)",
                    flush=True,
                )
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:  # SIGTERM stops the loop at its next phase boundary; then it is killed
            proc.send_signal(signal.SIGCONT)  # a paused loop (--pause) would not act on it
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return proc.returncode


def read_samples(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def pause(workdir: Path, stop: bool) -> str:
    """SIGSTOP (or SIGCONT) the soak's loop and log it in pauses.txt; what was done, in a line."""
    pid_file = workdir / "loop.pid"
    if not pid_file.exists():
        raise SystemExit(f"no soak has started in {workdir} (no loop.pid)")
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGSTOP if stop else signal.SIGCONT)
    except ProcessLookupError:
        raise SystemExit(f"the soak's loop (pid {pid}) is not running") from None
    with (workdir / "pauses.txt").open("a") as log:
        log.write(f"{'stop' if stop else 'cont'} {time.time():.3f}\n")
    return f"the soak's loop (pid {pid}) {'paused' if stop else 'going on'}"


def paused_spans(workdir: Path) -> list[tuple[float, float]]:
    """The pauses as (from, to) on the soak's clock (seconds): pauses.txt's wall times through clock.txt's starts;
    a pause not ended yet runs to the end of time."""
    clock_file, pauses_file = workdir / "clock.txt", workdir / "pauses.txt"
    if not pauses_file.exists() or not clock_file.exists():
        return []
    starts = sorted(tuple(map(float, line.split())) for line in clock_file.read_text().split("\n") if line.strip())

    def on_clock(wall: float) -> float:
        epoch, offset = next((s for s in reversed(starts) if s[0] <= wall), starts[0])
        return offset + wall - epoch

    spans, begun = [], None
    for line in pauses_file.read_text().split("\n"):
        if not line.strip():
            continue
        what, wall = line.split()
        if what == "stop" and begun is None:
            begun = on_clock(float(wall))
        elif what == "cont" and begun is not None:
            spans.append((begun, on_clock(float(wall))))
            begun = None
    if begun is not None:
        spans.append((begun, float("inf")))
    return spans


def running_time(rows: list[dict], spans: list[tuple[float, float]]) -> list[dict]:
    """The samples taken while the loop ran, their `seconds` the loop's running time (the pauses before them
    taken out)."""
    out = []
    for row in rows:
        t = row["seconds"]
        if any(a <= t <= b for a, b in spans):
            continue
        out.append({**row, "seconds": t - sum(b - a for a, b in spans if b < t)})
    return out


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (0 for fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def report(rows: list[dict], warmup_min: float) -> dict:
    """The slope after warm-up (% of the mean per hour) for the loop and its tree, and the resident set per hour."""
    kept = [r for r in rows if r["seconds"] >= warmup_min * 60]
    out: dict = {"samples": len(rows), "hours": round(rows[-1]["seconds"] / 3600, 2) if rows else 0.0}
    out["episodes"] = int(rows[-1]["episodes"]) if rows else 0
    # a soak sampled before the anon_kb column has no such series
    for key in [k for k in ("rss_kb", "anon_kb", "tree_kb") if all(k in r for r in rows)]:
        name = key.removesuffix("_kb")
        if len(kept) < 2:
            out[name] = None
            continue
        mean = sum(r[key] for r in kept) / len(kept)
        per_hour = slope([(r["seconds"] / 3600, r[key]) for r in kept])
        out[name] = {
            "mean_mib": round(mean / 1024, 1),
            "max_mib": round(max(r[key] for r in rows) / 1024, 1),
            "slope_mib_per_hour": round(per_hour / 1024, 2),
            "slope_pct_per_hour": round(100 * per_hour / mean, 3),
        }
    hourly = []
    for hour in range(1, int(out["hours"]) + 2):
        at = [r for r in rows if r["seconds"] <= hour * 3600]
        if at and (not hourly or at[-1]["seconds"] != hourly[-1]["seconds"]):
            last = at[-1]
            hourly.append(
                {
                    "seconds": last["seconds"],
                    "episodes": int(last["episodes"]),
                    "rss_mib": round(last["rss_kb"] / 1024),
                    "tree_mib": round(last["tree_kb"] / 1024),
                }
            )
    out["hourly"] = hourly
    return out


def table(result: dict, model: str, warmup_min: float) -> str:
    lines = [
        f"{model} model, {result['hours']} h, {result['episodes']} episodes, {result['samples']} samples",
        "",
        f"| series | mean MiB after {warmup_min:.0f} min | max MiB | slope MiB/h | slope %/h (target within 1%) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in (
        ("rss", "the loop"),
        ("anon", "the loop, anonymous memory"),
        ("tree", "the loop + its processes"),
    ):
        if name not in result:
            continue
        r = result[name]
        if r is None:
            lines.append(f"| {label} | - | - | - | - (too few samples after warm-up) |")
        else:
            lines.append(
                f"| {label} | {r['mean_mib']} | {r['max_mib']} | {r['slope_mib_per_hour']:+.2f} | "
                f"{r['slope_pct_per_hour']:+.3f} |"
            )
    lines += ["", "| at | episodes | loop MiB | tree MiB |", "|---:|---:|---:|---:|"]
    lines += [
        f"| {h['seconds'] / 3600:.2f} h | {h['episodes']} | {h['rss_mib']} | {h['tree_mib']} |"
        for h in result["hourly"]
    ]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str, warmup_min: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [r["seconds"] / 3600 for r in rows]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(hours, [r["rss_kb"] / 1024 for r in rows], label="the loop (VmRSS)")
    ax.plot(hours, [r["tree_kb"] / 1024 for r in rows], label="the loop + game processes")
    ax.axvline(warmup_min / 60, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("hours")
    ax.set_ylabel("resident MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hours", type=float, default=6.0)
    p.add_argument(
        "--episodes", type=int, help="end when the loop has played this many episodes (or at --hours, if sooner)"
    )
    p.add_argument("--model", choices=("scripted", "tiny"), default="scripted")
    p.add_argument("--workdir", type=Path, default=ROOT / "bench-runs" / "memory-soak")
    p.add_argument("--sample-s", type=float, default=60.0)
    p.add_argument("--warmup-min", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--report", action="store_true", help="only read samples.csv and print the table")
    p.add_argument("--pause", action="store_true", help="stop the running soak's loop (SIGSTOP) until --unpause")
    p.add_argument("--unpause", action="store_true", help="let a paused soak's loop go on (SIGCONT)")
    p.add_argument("--plot", type=Path, help="draw the series into this PNG")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    if (
        args.hours <= 0
        or args.sample_s <= 0
        or args.warmup_min < 0
        or (args.episodes is not None and args.episodes < 1)
    ):
        p.error("--hours, --sample-s and --episodes must be positive, --warmup-min not negative")
    if args.pause or args.unpause:
        if args.pause and args.unpause:
            p.error("--pause and --unpause are two commands: give one")
        print(pause(args.workdir, stop=args.pause))
        return 0
    status = 0
    if not args.report:
        status = soak(args.workdir, args.model, args.hours, args.sample_s, args.seed, args.set, args.episodes)
        if status not in (0, -signal.SIGTERM):
            print(f"the loop exited {status} (see {args.workdir / 'loop.log'})", file=sys.stderr)
    samples = args.workdir / "samples.csv"
    if not samples.exists():
        p.error(f"no samples at {samples}: run the soak first (without --report)")
    sampled = read_samples(samples)
    spans = paused_spans(args.workdir)
    rows = running_time(sampled, spans)
    if spans:
        end = sampled[-1]["seconds"] if sampled else 0.0
        paused = sum(max(0.0, min(b, end) - a) for a, b in spans) / 60
        still = " (the loop is paused now)" if spans[-1][1] == float("inf") else ""
        print(f"{len(spans)} pause(s), {paused:.0f} min, left out of the hours and the slope{still}")
    result = report(rows, args.warmup_min)
    print(table(result, args.model, args.warmup_min))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(rows, args.plot, f"own-experience loop, {args.model} model: resident memory", args.warmup_min)
    return 0 if status in (0, -signal.SIGTERM) else 1


if __name__ == "__main__":
    sys.exit(main())
