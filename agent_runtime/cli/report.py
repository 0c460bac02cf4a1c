"""The `report` command: a run's continual-learning matrix and its learning table, from the store alone.

    agent-runtime report [--workdir DIR | --db URL] [--run ID] [--json]

The matrix (`agent_runtime.evaluation.matrix`) exists for a run with a `curriculum:` section: R[i][j], held-out
success on every environment after each phase, with ACC, BWT and FWT and their intervals. The learning table is the
newest OPCD cycle's (`agent_runtime.evaluation.cycle_table`). Nothing is played and no model is loaded.
"""

from __future__ import annotations

from agent_runtime.cli.common import UsageError, add_command, open_store, print_result


def cmd_report(args) -> int:
    from agent_runtime.evaluation.cycle_table import learning_table
    from agent_runtime.evaluation.heldout import decisions_line, decisions_on_reported
    from agent_runtime.evaluation.matrix import stored_matrix
    from agent_runtime.evaluation.rounds import courses, courses_table, load_rounds
    from agent_runtime.terminal import shown

    with open_store(args) as store:
        runs = store.runs()
        if not runs:
            raise UsageError(f"no runs in {store.url}")
        run = store.get_run(args.run) if args.run is not None else runs[-1]
        matrix = stored_matrix(store, run)
        rounds = load_rounds(store, run.id, matrix) if matrix is not None else []
        table = learning_table(store, run.id)
        decided = decisions_on_reported(store, run.id)
    lines = [f"run {run.id} ({run.name})"]
    if matrix is not None:
        lines.append(matrix.table())
        lines.append(
            "Each family over the rounds (held-out success; drops in points):\n" + courses_table(matrix, shown)
        )
        if any(r.lessons or r.drift or r.seconds for r in rounds):
            lines.append("Rounds:\n" + "\n".join(shown(r.line(matrix.envs)) for r in rounds))
    if table:
        lines.append(table)
    if decided and (matrix is not None or table):
        lines.append(decisions_line(decided))
    if matrix is None and not table:
        lines.append("no curriculum assessments and no OPCD cycle yet: nothing to report")
    payload = {
        "run_id": run.id,
        "name": run.name,
        "continual": matrix.as_dict() if matrix is not None else None,
        "courses": [vars(c) for c in courses(matrix)] if matrix is not None else None,
        "rounds": [{"after_phase": r.after_phase, "rates": r.rates, **r.stored()} for r in rounds],
        "learning_table": table,
        "decisions_on_held_out_games": decided,
    }
    print_result(args, payload, lines)
    return 0


def register(sub) -> None:
    report = add_command(
        sub, "report", cmd_report, "a run's continual-learning matrix (R, ACC, BWT, FWT) and learning table"
    )
    report.add_argument("--run", type=int, help="the run (default: the newest)")
