"""The soak's invariants, read from a store after a kill or at the end (bench/soak.py; tests/bench/test_soak.py).

- `draw_violations`: every draw index below `next_draw` committed exactly once or still open, and the run's
  counters equal to the rows (nothing lost, nothing duplicated, nothing counted that is not stored);
- `phase_violations`: no phase done twice and none skipped: EXTRACT at every multiple of `extract_every` and
  once there, an OPCD cycle finished at every multiple of `consolidate_every` that had live lessons, interrupted
  cycles rolled back and run again, the counters equal to the rows;
- `budget_violations`: every lesson-set version within `lessons.budget_tokens`, pool by pool.

Each returns a list of sentences, empty when all holds. When a phase ran is read from the store alone (see
`phase_record`), so the checks need nothing the soak saw from outside.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict


def draw_violations(store, run) -> list[str]:
    """Every draw index below next_draw committed exactly once or still open, and the counters equal the rows."""
    episodes = store.episodes(run.id, limit=10**9, newest_first=False)
    state, out = run.state, []
    draws = Counter(e.metadata.get("draw") for e in episodes)
    committed, open_draws = set(draws), set(state.get("open_draws", []))
    if dup := sorted(d for d, n in draws.items() if n > 1):
        out.append(f"draws committed more than once: {dup[:10]}")
    if both := sorted(committed & open_draws):
        out.append(f"draws both committed and open: {both[:10]}")
    expected = set(range(state.get("next_draw", 0)))
    if lost := sorted(expected - committed - open_draws):
        out.append(f"draws lost (neither committed nor open): {lost[:10]}")
    if beyond := sorted((committed | open_draws) - expected, key=str):
        out.append(f"draws at or past next_draw {state.get('next_draw')}: {beyond[:10]}")
    counted = {
        "episodes": len(episodes),
        "won": sum(e.won for e in episodes),
        "errors": sum(e.outcome == "error" for e in episodes),
    }
    for key, rows in counted.items():
        if state.get(key, 0) != rows:
            out.append(f"state.{key} = {state.get(key, 0)} but the rows say {rows}")
    return out


def budget_violations(store, run_id: int, count_tokens, budget: int) -> list[str]:
    """Every lesson-set version (live or candidate), pool by pool, within the budget as the curator counts it."""
    from distill.lessons.curate import render_lessons

    out = []
    for version in store.lesson_sets(run_id):
        lessons = {x.id: x for x in store.lessons(run_id, ids=version.lesson_ids)}
        for pool in sorted({x.pool for x in lessons.values()}):
            tokens = count_tokens(
                render_lessons(lessons[i].text for i in version.lesson_ids if lessons[i].pool == pool)
            )
            if tokens > budget:
                out.append(f"lesson set v{version.version} pool {pool}: {tokens} tokens > budget {budget}")
    return out


def phase_record(store, run_id: int) -> dict:
    """When each phase ran, as the episode count at the time: the episodes that ended before its row (an
    extraction, a cycle, a lesson-set version) was written. PLAY has drained before a phase starts, so every
    row of one phase has the same point; a phase done twice would show twice the rows at its point."""
    episodes = store.episodes(run_id, limit=10**9, newest_first=False)
    rank = {e.id: i + 1 for i, e in enumerate(episodes)}
    ends = sorted(e.ended_at for e in episodes)
    reads: dict[int, Counter] = defaultdict(Counter)  # point -> the ranks of the episodes its extractions read
    rows: Counter = Counter()
    for x in store.extractions(run_id, limit=10**9):
        point = bisect_left(ends, x.created_at)
        rows[point] += 1
        reads[point].update(rank[i] for i in x.episode_ids)
    return {
        "episodes": episodes,
        "ends": ends,
        "extraction_rows": rows,
        "extraction_reads": dict(reads),
        "cycles": [(bisect_left(ends, c.started_at), c) for c in store.cycles(run_id)],
        "versions": [(bisect_left(ends, v.created_at), v) for v in store.lesson_sets(run_id)],
    }


def phase_violations(store, run, config, record: dict | None = None) -> list[str]:
    """EXTRACT at every multiple of extract_every and once (each read episode once per pool, one gate decision
    per candidate), a cycle finished at every multiple of consolidate_every that had live lessons and at no
    other point, interrupted cycles rolled back, counters equal to the rows."""
    from memory import EVALUATION_GATE, LESSON_SET_CANDIDATE, LESSON_SET_LIVE

    lessons, opcd = config["lessons"], config["opcd"]
    record = record or phase_record(store, run.id)
    n, out = len(record["episodes"]), []
    read = min(lessons["recent_episodes"] or lessons["extract_every"], lessons["extract_every"])
    per_phase = read * lessons["pools"]
    expected = [k * lessons["extract_every"] for k in range(1, n // lessons["extract_every"] + 1)]
    seen = sorted(record["extraction_rows"])
    if seen != expected:
        out.append(
            f"EXTRACT ran at {seen[:8]}..., the schedule says {expected[:8]}... ({len(seen)} vs {len(expected)})"
        )
    if twice := {p: c for p, c in record["extraction_rows"].items() if c != per_phase}:
        out.append(f"EXTRACT phases with other than {per_phase} extractions (a phase done twice?): {twice}")
    for point, reads in record["extraction_reads"].items():
        if reads != Counter({r: lessons["pools"] for r in range(point - read + 1, point + 1)}):
            out.append(
                f"EXTRACT at episode {point} read episodes (rank: times) {dict(reads)}; expected each of the "
                f"{read} newest once per pool"
            )
    if run.state.get("extractions") != len(seen):
        out.append(f"state.extractions = {run.state.get('extractions')} but {len(seen)} EXTRACT phases are stored")
    gates = Counter(e.lesson_set_version for e in store.evaluations(run_id=run.id, kind=EVALUATION_GATE))
    candidates = {v.version for _, v in record["versions"] if v.status == LESSON_SET_CANDIDATE}
    if wrong := {v: gates[v] for v in candidates | set(gates) if gates[v] != int(v in candidates)}:
        out.append(f"gate decisions per version (one per candidate expected): {wrong}")
    finished = [(p, c) for p, c in record["cycles"] if not (c.error or "").startswith("interrupted")]
    if running := [c.id for _, c in finished if c.status == "running"]:
        out.append(f"cycles left running: {running}")
    consolidated_by = {x.consolidated_cycle_id for x in store.lessons(run.id) if x.consolidated_cycle_id}
    consolidating = Counter(p for p, c in finished if c.id in consolidated_by)
    extract_points = set(seen)  # an EXTRACT writes one version (gated: a candidate, then the gate's live one)
    for status, by_cycles in ((LESSON_SET_CANDIDATE, False), (LESSON_SET_LIVE, True)):
        for point, count in Counter(p for p, v in record["versions"] if v.status == status).items():
            allowed = int(point in extract_points) + (consolidating[point] if by_cycles else 0)
            if count > allowed:
                out.append(f"{count} {status} lesson-set versions at episode {point}, at most {allowed} expected")
    expected_cycles = [
        p for p in range(opcd["consolidate_every"], n + 1, opcd["consolidate_every"]) if _live_at(record, p)
    ]
    if (points := [p for p, _ in finished]) != expected_cycles:
        out.append(f"cycles finished at {points}, the schedule says {expected_cycles}")
    if run.state.get("cycles") != len(finished):
        out.append(f"state.cycles = {run.state.get('cycles')} but {len(finished)} cycles finished")
    for point, cycle in record["cycles"]:
        if (cycle.error or "").startswith("interrupted") and cycle.status != "rolled_back":
            out.append(f"interrupted cycle {cycle.id} is {cycle.status}, not rolled back")
        if (cycle.error or "").startswith("interrupted") and point not in points:
            out.append(f"interrupted cycle {cycle.id} at episode {point} was never run again")
    promoted = [c for _, c in finished if c.status == "promoted"]
    active = store.active_adapter(run.id)
    if (active.id if active else None) != (promoted[-1].adapter_id if promoted else None):
        out.append(f"active adapter {active.id if active else None} is not the last promoted cycle's")
    return out


def _live_at(record: dict, point: int) -> bool:
    """Whether the live lesson set was non-empty when the CONSOLIDATE due at `point` ran (before its cycle)."""
    cycle = next((c for p, c in record["cycles"] if p == point), None)
    ends = record["ends"]
    moment = cycle.started_at if cycle is not None else (ends[point] if point < len(ends) else None)
    live = [v for _, v in record["versions"] if v.status == "live" and (moment is None or v.created_at < moment)]
    return bool(live and live[-1].lesson_ids)
