"""The soak's report: the numbers of bench/soak.py's run, as a table and as a section appended to RESULTS.

`Soak.report` (bench/soak.py) gathers the record of one soak: its sessions and what the store held after the last
one. These turn that record into what the table shows: episodes a minute over the first and the last window
(`rates`), how long EXTRACT and the cycles took early and late (`phase_seconds`), the resident memory of the
killed sessions and of the final one as it played on (`rss_table`), and the store's bytes per episode (`db_table`).
"""

from __future__ import annotations

import datetime as dt
import subprocess
from itertools import pairwise
from pathlib import Path

from bench.soak_session import Session

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Soak under SIGKILL (`bench/soak.py`)"


def rates(episodes: list, gaps: set[int], offset: int) -> dict:
    """Episodes/min over a window: PLAY only (the intervals across a restart or a phase left out), and wall."""
    ends = [e.ended_at for e in episodes]
    kept = [(b - a).total_seconds() for k, (a, b) in enumerate(pairwise(ends), start=offset + 1) if k not in gaps]
    wall = (ends[-1] - ends[0]).total_seconds() if len(ends) > 1 else 0.0
    return {
        "play_per_min": round(60 * len(kept) / sum(kept), 1) if kept and sum(kept) > 0 else 0.0,
        "wall_per_min": round(60 * (len(ends) - 1) / wall, 1) if wall > 0 else 0.0,
    }


def phase_seconds(record: dict, restarts: set[int]) -> dict:
    """How long EXTRACT (from the last episode before it to its last lesson-set version; not where a restart came
    in between) and the finished cycles took: the medians of the first ten and of the last ten, to see whether
    a phase slows as the store grows."""
    from statistics import median

    ends, cycle_start = record["ends"], {p: c.started_at for p, c in record["cycles"]}
    extract = []
    for point in sorted(record["extraction_rows"]):
        made = [
            v.created_at
            for p, v in record["versions"]
            if p == point and (point not in cycle_start or v.created_at < cycle_start[point])
        ]
        if made and point > 0 and point not in restarts:
            extract.append((max(made) - ends[point - 1]).total_seconds())
    cycles = [
        (c.ended_at - c.started_at).total_seconds()
        for _, c in record["cycles"]
        if c.ended_at and not (c.error or "").startswith("interrupted")
    ]

    def ends_of(xs: list[float]) -> list[float]:
        return [round(median(xs[:10]), 1), round(median(xs[-10:]), 1)] if xs else [0.0, 0.0]

    return {"extract_first_last": ends_of(extract), "cycle_first_last": ends_of(cycles)}


def rss_table(sessions: list[Session]) -> dict:
    """Peak RSS of the killed sessions (first and last ten), and the final session's RSS as it played on."""
    killed = [x.peak_rss_kb / 1024 for x in sessions if x.killed and x.peak_rss_kb]
    final = sessions[-1] if sessions and sessions[-1].kind == "final" else None
    over_time = []
    if final and final.rss:
        span = max(1, (final.rss[-1][2] - final.start_episodes) // 5)
        mark = final.start_episodes
        for t, kb, done in final.rss:
            if done > final.start_episodes and done >= mark:  # from its first commit on (start-up is not growth)
                over_time.append({"episodes": done, "seconds": t, "rss_mib": round(kb / 1024, 1)})
                mark = done + span
        last = final.rss[-1]
        over_time.append({"episodes": last[2], "seconds": last[0], "rss_mib": round(last[1] / 1024, 1)})

    def mean(xs: list[float]) -> float:
        return round(sum(xs) / len(xs), 1) if xs else 0.0

    return {
        "killed_first10_mib": mean(killed[:10]),
        "killed_last10_mib": mean(killed[-10:]),
        "killed_max_mib": round(max(killed, default=0.0), 1),
        "final_peak_mib": round((final.peak_rss_kb if final else 0) / 1024, 1),
        "final_over_time": over_time,
        "final_tree_mib": [(t, round(kb / 1024), n) for t, kb, n in (final.tree_rss if final else [])],
    }


def db_table(sessions: list[Session], sqlite: bool) -> dict:
    """The store's size per episode after each session, and the marginal bytes per episode past the first third."""
    points = [(x.end_episodes, x.db_bytes) for x in sessions if x.db_bytes and x.end_episodes]
    if not points:
        return {}
    n, size = points[-1]
    start = next(((e, b) for e, b in points if e >= n / 3), points[0])
    marginal = (size - start[1]) / (n - start[0]) if n > start[0] else 0.0
    return {
        "kind": "SQLite file + WAL" if sqlite else "pg_database_size",
        "bytes": size,
        "episodes": n,
        "bytes_per_episode": round(size / n),
        "marginal_bytes_per_episode": round(marginal),
        "from_episode": start[0],
    }


def table(report: dict) -> str:
    """The soak's numbers as a markdown table."""
    r, f, last, rss, db = report, report["first"], report["last"], report["rss"], report["db"]
    phases = ", ".join(f"{k} {v}" for k, v in sorted(r["kills_by_phase"].items()))
    over = "; ".join(f"{p['episodes']} ep {p['rss_mib']:.0f}" for p in rss["final_over_time"])
    rows = [
        ("kills (SIGKILL, each resumed)", f"{r['kills']} ({phases})"),
        ("episodes", f"{r['episodes']} ({r['episodes_under_kills']} under kills, then run on), {r['steps']} steps"),
        (
            "EXTRACT phases / lesson-set versions (live)",
            f"{r['extractions']} / {r['lesson_sets']} ({r['lesson_sets_live']})",
        ),
        ("OPCD cycles", ", ".join(f"{k} {v}" for k, v in sorted(r["cycles"].items())) or "none"),
        (f"episodes/min, first {r['window']}: PLAY only / wall", f"{f['play_per_min']} / {f['wall_per_min']}"),
        (f"episodes/min, last {r['window']}: PLAY only / wall", f"{last['play_per_min']} / {last['wall_per_min']}"),
        (
            "EXTRACT / OPCD cycle seconds, median of the first 10 -> last 10",
            "{} -> {} / {} -> {}".format(
                *r["phase_seconds"]["extract_first_last"], *r["phase_seconds"]["cycle_first_last"]
            ),
        ),
        (
            "peak RSS of killed sessions: first 10 / last 10 / max (MiB)",
            f"{rss['killed_first10_mib']} / {rss['killed_last10_mib']} / {rss['killed_max_mib']}",
        ),
        ("RSS of the final session as it played on (MiB)", over or "-"),
        (
            "all its processes (loop, game processes, fork server): first / last sample (MiB, count)",
            " / ".join(f"{kb} ({n})" for _, kb, n in rss["final_tree_mib"][1:2] + rss["final_tree_mib"][-1:]) or "-",
        ),
        (
            f"database ({db.get('kind', '-')})",
            f"{db.get('bytes', 0) / 2**20:.1f} MiB for {db.get('episodes', 0)} episodes",
        ),
        (
            "bytes per episode: overall / marginal",
            (
                f"{db.get('bytes_per_episode', 0)} / {db.get('marginal_bytes_per_episode', 0)} "
                f"(from episode {db.get('from_episode', 0)})"
            ),
        ),
        ("processes outliving a kill / game folders left in TMPDIR", f"{r['survivors']} / {r['game_dirs_left']}"),
        ("invariant violations", str(len(r["violations"]))),
        ("wall time", f"{r['seconds'] / 60:.1f} min"),
    ]
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


def append_results(path: Path, report: dict, command: str) -> None:
    """Append this soak's section to bench/RESULTS.md (never rewriting what is there)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    dirty = " (others' uncommitted changes in the tree)" if git("status", "--porcelain", "--untracked-files=no") else ""
    verdict = "none" if not report["violations"] else "; ".join(report["violations"][:10])
    when = (
        f"Measured {dt.date.today()} at commit {git('rev-parse', '--short', 'HEAD')}{dirty}, on the development "
        f"machine (2 shared cores, other jobs running). Command: `{command}`\n"
    )
    body = [f"\n{HEADING}\n", when, table(report), "", f"Invariant violations: {verdict}.", ""]
    with path.open("a") as out:
        out.write("\n".join(body))
