"""The `memory` commands: read and maintain the experience store.

    agent-runtime memory stats|export|import|reindex|search|prune|vacuum [--workdir DIR | --db URL] [--json]

Reads open the store read-only; `memory import`, `memory reindex`, `memory prune --yes` and `memory vacuum` write.
`memory import` is all or nothing, and every lesson in the file goes through the lesson safety screen
(`distill.lessons.safety.stored_lesson_problem`): one it rejects, a value that is not finite or not Unicode text, fails
the whole import with a message naming the line (exit 2), and nothing is written. Rows of a run already in the store
never change what it acts with (`memory.transfer_existing`): the command prints what it changed in them. `memory prune` keeps a run's last N
episodes and/or last D days (and every episode a live lesson or an adapter's training set came from); without `--yes` it
only prints what it would delete.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent_runtime.cli.common import UsageError, add_command, open_store, print_result, progress_bars, shown


def cmd_stats(args) -> int:
    with open_store(args) as store:
        stats = store.stats()
    print_result(args, stats, [f"{k:>12}: {v}" for k, v in stats.items()])
    return 0


def cmd_export(args) -> int:
    with open_store(args) as store:
        counts = store.export_jsonl(sys.stdout if str(args.path) == "-" else args.path)
    if str(args.path) != "-":
        print_result(args, counts, [f"exported to {args.path}: " + ", ".join(f"{v} {k}" for k, v in counts.items())])
    return 0


def cmd_import(args) -> int:
    if not Path(args.path).is_file():
        raise UsageError(f"no such file: {args.path}")
    if args.db:
        target = args.db
    else:
        target = str(args.workdir or Path("."))
    from distill.lessons.safety import stored_lesson_problem
    from memory import ExperienceStore

    notes: list[str] = []  # what the import changed in rows of runs already in the store
    with ExperienceStore.open(target) as store:  # every lesson through the lesson screen; one it rejects fails all
        counts = store.import_jsonl(args.path, lesson_screen=stored_lesson_problem, notes=notes)
    payload = {**counts, "notes": notes} if notes else counts
    lines = [f"imported from {args.path}: " + ", ".join(f"{v} {k}" for k, v in counts.items())]
    print_result(args, payload, lines + notes)
    return 0


def cmd_reindex(args) -> int:
    update, bars = progress_bars()
    with open_store(args, read_only=False) as store:
        status = store.reindex(progress=update)
    for bar in bars.values():
        bar.close()
    print_result(args, status, [f"{kind}: {info}" for kind, info in status.items()])
    return 0


def cmd_prune(args) -> int:
    if args.keep is None and args.days is None:
        raise UsageError("say what to keep: --keep N (the run's last N episodes) and/or --days D (the last D days)")
    if (args.keep is not None and args.keep < 0) or (args.days is not None and not args.days >= 0):
        raise UsageError("--keep and --days take numbers of 0 or more")
    with open_store(args, read_only=not args.yes) as store:
        runs = store.runs()
        if args.run is None:
            if len(runs) != 1:
                known = ", ".join(f"{r.id} ({r.name})" for r in runs) or "none"
                raise UsageError(f"which run? pass --run ID; runs in this store: {known}")
            args.run = runs[0].id
        if all(r.id != args.run for r in runs):
            raise UsageError(f"no run {args.run}; runs in this store: {', '.join(str(r.id) for r in runs) or 'none'}")
        plan = store.prune_plan(args.run, keep_last=args.keep, days=args.days)
        if args.yes and plan.episode_ids:
            update, bars = progress_bars()
            plan = store.prune(plan, progress=update)
            for bar in bars.values():
                bar.close()
    print_result(args, {**plan.as_json(), "deleted": bool(args.yes)}, _prune_lines(plan, args.yes, store.dialect))
    return 0


def _prune_lines(plan, deleted: bool, dialect: str) -> list[str]:
    kept = (
        f"kept: {plan.kept_recent} recent, {plan.kept_for_lessons} a live lesson came from, "
        f"{plan.kept_for_adapters} in an adapter's training set" + (", the store's newest" if plan.kept_newest else "")
    )
    if not plan.episode_ids:
        return [f"run {plan.run_id}: nothing to prune of its {plan.episodes} episodes ({kept})"]
    verb = "deleted" if deleted else "would delete"
    head = (
        f"run {plan.run_id}: {verb} {len(plan.episode_ids)} of {plan.episodes} episodes ({plan.steps} steps), "
        f"ended {plan.oldest:%Y-%m-%d %H:%M} to {plan.newest:%Y-%m-%d %H:%M} UTC"
    )
    lines = [head, f"  ids: {plan.ranges()}", f"  {kept}"]
    if not deleted:
        lines.append("dry run: nothing was deleted; add --yes to delete them")
    elif dialect == "sqlite":
        lines.append(
            "the freed space is reused by new episodes; `agent-runtime memory vacuum` gives it back to the disk"
        )
    return lines


def cmd_vacuum(args) -> int:
    with open_store(args, read_only=False) as store:
        store.vacuum()
    print_result(args, {"vacuumed": True}, ["vacuumed"])
    return 0


def cmd_search(args) -> int:
    # read-write: a search first embeds what is not embedded yet, so it sees everything stored
    with open_store(args, read_only=False) as store:
        if args.kind == "lessons":
            hits = store.search_lessons(args.query, args.k, run_id=args.run)
            rows = [{"id": h.id, "score": h.score, "text": h.item.text, "status": h.item.status} for h in hits]
            lines = [f"{r['score']:.3f}  lesson {r['id']} [{r['status']}]  {shown(r['text'])}" for r in rows]
        else:
            hits = store.search_episodes(args.query, args.k, run_id=args.run, env_id=args.env)
            rows = [
                {
                    "id": h.id,
                    "score": h.score,
                    "env_id": h.item.env_id,
                    "task_id": h.item.task_id,
                    "outcome": h.item.outcome,
                    "goal": h.item.goal,
                }
                for h in hits
            ]
            lines = [
                f"{r['score']:.3f}  episode {r['id']} {shown(r['env_id'])} {shown(r['task_id'])} {r['outcome']}  "
                f"{shown((r['goal'] or '')[:80])}"
                for r in rows
            ]
    print_result(args, rows, lines or ["no matches"])
    return 0


def register(sub) -> None:
    memory = sub.add_parser("memory", help="inspect and maintain the experience memory")
    msub = memory.add_subparsers(dest="memory_cmd", required=True)

    add_command(msub, "stats", cmd_stats, "counts of runs, episodes, steps, lessons")
    add_command(msub, "export", cmd_export, "write the whole store as versioned JSONL").add_argument(
        "path", help="output file, or - for stdout"
    )
    add_command(msub, "import", cmd_import, "read a JSONL export into the store (all or nothing)").add_argument("path")
    add_command(msub, "reindex", cmd_reindex, "recompute missing vectors and rebuild every FAISS index from SQL")
    prune = add_command(
        msub,
        "prune",
        cmd_prune,
        "delete a run's old episodes (dry run without --yes)",
        description="Keep a run's last N episodes and/or the last D days (either keeps an episode), "
        "and always the episodes a live lesson's provenance or an adapter's training set points at; "
        "delete the rest with their steps and vectors (the FAISS indexes are rebuilt). Without --yes "
        "it only prints what it would delete.",
    )
    prune.add_argument("--run", type=int, help="the run (required when the store holds several)")
    prune.add_argument("--keep", type=int, metavar="N", help="keep the run's N newest episodes")
    prune.add_argument("--days", type=float, metavar="D", help="keep the episodes that ended in the last D days")
    prune.add_argument("--yes", action="store_true", help="delete (default: print what would be deleted)")
    add_command(msub, "vacuum", cmd_vacuum, "give the space of deleted rows back to the disk (SQLite VACUUM)")
    search = add_command(msub, "search", cmd_search, "semantic search over lessons or episodes")
    search.add_argument("query")
    search.add_argument("--kind", choices=("lessons", "episodes"), default="lessons")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--run", type=int)
    search.add_argument("--env")
