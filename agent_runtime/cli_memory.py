"""The `memory` commands: read and maintain the experience store.

    agent-runtime memory stats|export|import|reindex|search [--workdir DIR | --db URL] [--json]

Reads open the store read-only; `memory import` and `memory reindex` write.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent_runtime.cli_common import UsageError, add_command, open_store, print_result, progress_bars


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
    from memory import ExperienceStore

    with ExperienceStore.open(target) as store:
        counts = store.import_jsonl(args.path)
    print_result(args, counts, [f"imported from {args.path}: " + ", ".join(f"{v} {k}" for k, v in counts.items())])
    return 0


def cmd_reindex(args) -> int:
    update, bars = progress_bars()
    with open_store(args, read_only=False) as store:
        status = store.reindex(progress=update)
    for bar in bars.values():
        bar.close()
    print_result(args, status, [f"{kind}: {info}" for kind, info in status.items()])
    return 0


def cmd_search(args) -> int:
    # read-write: a search first embeds what is not embedded yet, so it sees everything stored
    with open_store(args, read_only=False) as store:
        if args.kind == "lessons":
            hits = store.search_lessons(args.query, args.k, run_id=args.run)
            rows = [{"id": h.id, "score": h.score, "text": h.item.text, "status": h.item.status} for h in hits]
            lines = [f"{r['score']:.3f}  lesson {r['id']} [{r['status']}]  {r['text']}" for r in rows]
        else:
            hits = store.search_episodes(args.query, args.k, run_id=args.run, env_id=args.env)
            rows = [{"id": h.id, "score": h.score, "env_id": h.item.env_id, "task_id": h.item.task_id,
                     "outcome": h.item.outcome, "goal": h.item.goal} for h in hits]
            lines = [f"{r['score']:.3f}  episode {r['id']} {r['env_id']} {r['task_id']} {r['outcome']}  "
                     f"{(r['goal'] or '')[:80]}" for r in rows]
    print_result(args, rows, lines or ["no matches"])
    return 0


def register(sub) -> None:
    memory = sub.add_parser("memory", help="inspect and maintain the experience memory")
    msub = memory.add_subparsers(dest="memory_cmd", required=True)

    add_command(msub, "stats", cmd_stats, "counts of runs, episodes, steps, lessons")
    add_command(msub, "export", cmd_export, "write the whole store as versioned JSONL").add_argument(
        "path", help="output file, or - for stdout")
    add_command(msub, "import", cmd_import, "read a JSONL export into the store (all or nothing)").add_argument("path")
    add_command(msub, "reindex", cmd_reindex, "recompute missing vectors and rebuild every FAISS index from SQL")
    search = add_command(msub, "search", cmd_search, "semantic search over lessons or episodes")
    search.add_argument("query")
    search.add_argument("--kind", choices=("lessons", "episodes"), default="lessons")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--run", type=int)
    search.add_argument("--env")
