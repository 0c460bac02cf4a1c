"""The CLI commands that read or maintain the experience store: `memory ...` and `lessons ...`.

    agent-runtime memory stats|export|import|reindex|search [--workdir DIR | --db URL] [--json]
    agent-runtime lessons list|show|diff|rollback [--workdir DIR | --db URL] [--run ID] [--json]
    agent-runtime lessons add TEXT [TEXT ...] [--workdir DIR | --db URL] [--run ID] [--config CONFIG.yaml] [--json]
    agent-runtime lessons retire ID [ID ...] [--workdir DIR | --db URL] [--run ID] [--json]

Reads open the store read-only; `memory import`, `memory reindex`, `lessons rollback|add|retire` write. The
run a lessons command acts on is `--run ID`, else the newest run in the store (`lessons add --config`: the
run of that config's name, created from the config if the store has none, so that `agent-runtime run CONFIG
--resume` continues it). `lessons add` exits 1 when a text was rejected (the others still go in).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm


class UsageError(Exception):
    """A user-facing error: printed without a traceback, exit code 2."""


def add_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", type=Path, help="the run directory holding memory.db (default: .)")
    p.add_argument("--db", help="a SQLAlchemy URL instead of a workdir (e.g. postgresql+psycopg://...)")


def store_target(args) -> str:
    if args.db:
        return args.db
    workdir = args.workdir or Path(".")
    if not (workdir / "memory.db").exists():
        raise UsageError(f"no memory.db in {workdir}; pass --workdir DIR of a run, or --db URL")
    return str(workdir)


def open_store(args, read_only: bool = True, **kwargs):
    from memory import ExperienceStore

    return ExperienceStore.open(store_target(args), read_only=read_only, **kwargs)


def _print(args, payload, text_lines) -> None:
    if args.json:
        print(json.dumps(payload, default=str))
    else:
        for line in text_lines:
            print(line)


def _progress():
    bars: dict[str, tqdm] = {}

    def update(what: str, done: int, total: int) -> None:
        bar = bars.get(what) or bars.setdefault(what, tqdm(total=total, desc=what, unit="item", leave=False))
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bars


# -- memory ---------------------------------------------------------------------------------------------
def cmd_stats(args) -> int:
    with open_store(args) as store:
        stats = store.stats()
    _print(args, stats, [f"{k:>12}: {v}" for k, v in stats.items()])
    return 0


def cmd_export(args) -> int:
    with open_store(args) as store:
        counts = store.export_jsonl(sys.stdout if str(args.path) == "-" else args.path)
    if str(args.path) != "-":
        _print(args, counts, [f"exported to {args.path}: " + ", ".join(f"{v} {k}" for k, v in counts.items())])
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
    _print(args, counts, [f"imported from {args.path}: " + ", ".join(f"{v} {k}" for k, v in counts.items())])
    return 0


def cmd_reindex(args) -> int:
    update, bars = _progress()
    with open_store(args, read_only=False) as store:
        status = store.reindex(progress=update)
    for bar in bars.values():
        bar.close()
    _print(args, status, [f"{kind}: {info}" for kind, info in status.items()])
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
    _print(args, rows, lines or ["no matches"])
    return 0


# -- lessons --------------------------------------------------------------------------------------------
def _run_id(store, args) -> int:
    if args.run is not None:
        store.get_run(args.run)
        return args.run
    runs = store.runs()
    if not runs:
        raise UsageError(f"no runs in {store.url}")
    return runs[-1].id


def cmd_lessons_list(args) -> int:
    from distill.lessons import live_lessons

    with open_store(args) as store:
        run_id = _run_id(store, args)
        if args.status:
            version, lessons = None, store.lessons(run_id, status=args.status)
        else:
            version, lessons = live_lessons(store, run_id)
    rows = [{"id": x.id, "pool": x.pool, "status": x.status, "text": x.text, "sources": x.source_episode_ids,
             "source": x.metadata.get("source", "extracted"), "times_in_context": x.times_in_context}
            for x in lessons]
    head = (f"run {run_id}, lesson set v{version.version} ({len(rows)} lessons)" if version is not None
            else f"run {run_id}: {len(rows)} lessons")
    _print(args, {"run_id": run_id, "version": version.version if version else None, "lessons": rows},
           [head] + [f"#{r['id']:<5} pool {r['pool']} [{r['status']}]{' (user)' if r['source'] == 'user' else ''} "
                      f"{r['text']}" for r in rows])
    return 0


def cmd_lessons_show(args) -> int:
    from distill.lessons import lesson_provenance

    with open_store(args) as store:
        info = lesson_provenance(store, args.lesson_id)
    lines = [f"lesson #{info['id']} [{info['status']}] pool {info['pool']}: {info['text']}"]
    if info.get("extraction"):
        lines.append(f"  extraction #{info['extraction']['id']}")
    for ep in info["source_episodes"]:
        lines.append(f"  from episode {ep['id']}: {ep['env_id']} {ep['task_id']} {ep['outcome']} "
                     f"({ep['num_steps']} steps)")
    for parent in info.get("ancestry", []):
        lines.append(f"  {parent['relation']} #{parent['id']}: {parent['text']}")
    _print(args, info, lines)
    return 0


def cmd_lessons_diff(args) -> int:
    from distill.lessons import diff_versions

    with open_store(args) as store:
        diff = diff_versions(store, _run_id(store, args), args.old, args.new).to_dict()
    lines = [f"v{diff['old']} -> v{diff['new']}"]
    lines += [f"+ #{x['id']} {x['text']}" for x in diff["added"]]
    lines += [f"- #{x['id']} {x['text']}" for x in diff["removed"]]
    lines += [f"  merged #{a} into #{b}" for a, b in diff["merged"]]
    lines += [f"  updated #{a} -> #{b}" for a, b in diff["updated"]]
    _print(args, diff, lines)
    return 0


def _run_config(run):
    from agent_runtime.config import config_from_dict

    return config_from_dict(run.config, source=f"the stored config of run {run.id}")


def _add_target(args, config) -> str:
    """Where `lessons add` writes: --db, else the config's memory.url, else the workdir (made if a config
    can create the run there)."""
    if args.db:
        return args.db
    if config is not None and config.memory.url and args.workdir is None:
        return config.memory.url
    if args.workdir is not None:
        workdir = args.workdir
    elif config is not None:
        from agent_runtime.loop import default_workdir

        workdir = default_workdir(config.name)
    else:
        workdir = Path(".")
    if not (workdir / "memory.db").exists():
        if config is None:
            raise UsageError(f"no run in {workdir} (no memory.db): pass --config CONFIG.yaml to create the run, "
                             f"or start one first (agent-runtime run CONFIG --workdir {workdir})")
        workdir.mkdir(parents=True, exist_ok=True)
    return str(workdir)


def cmd_lessons_add(args) -> int:
    from agent_runtime.config import load_config
    from agent_runtime.lessons_phase import add_lessons, add_seed_lessons
    from memory import ExperienceStore
    from memory.embeddings import make_embedder

    config = load_config(args.config) if args.config else None
    with ExperienceStore.open(_add_target(args, config)) as store:
        created = False
        if args.run is not None:
            run = store.get_run(args.run)
        elif config is not None:
            run = store.find_run(config.name)
            if run is None:
                run = store.get_run(store.create_run(config.name, config.model_dump(mode="json")))
                created = True
        else:
            runs = store.runs()
            if not runs:
                raise UsageError(f"no run in {store.url}: pass --config CONFIG.yaml to create one, or start a run "
                                 "first (agent-runtime run CONFIG)")
            run = runs[-1]
        run_config = _run_config(run)
        spec = run_config.lessons.embedder or run_config.memory.embedder
        embedder = make_embedder(spec) if spec else None
        seeded = add_seed_lessons(run_config, store, run.id) if created else None
        result = add_lessons(run_config, store, run.id, args.text, embedder=embedder, note="lessons add")
    payload = {**result.to_dict(), "created_run": created,
               "seed": seeded.to_dict() if seeded is not None else None}
    head = [f"created run {run.id} ({run.name}) from {args.config}" if created else f"run {run.id} ({run.name})"]
    _print(args, payload, head + result.lines())
    return 1 if result.rejected else 0


def cmd_lessons_retire(args) -> int:
    from agent_runtime.lessons_phase import config_token_counter
    from distill.lessons import retire_lessons

    with open_store(args, read_only=False) as store:
        run_id = _run_id(store, args)
        count_tokens = config_token_counter(_run_config(store.get_run(run_id)).model)
        result = retire_lessons(store, run_id, args.lesson_ids, count_tokens=count_tokens, note="lessons retire")
    _print(args, result.to_dict(), result.lines())
    return 0


def cmd_lessons_rollback(args) -> int:
    from distill.lessons import restore_version

    with open_store(args, read_only=False) as store:
        run_id = _run_id(store, args)
        info = restore_version(store, run_id, args.version, note=f"rollback to v{args.version} from the CLI")
    _print(args, {"run_id": run_id, "restored": args.version, "new_version": info.version},
           [f"run {run_id}: lesson set v{args.version} restored as v{info.version}"])
    return 0


ADD_HELP = """Add lessons written by a person to every lesson pool of a run.

Each text goes through the same doors as an extracted lesson: the safety screen (a rejected text is
reported with its reason and not added; the others still go in; exit code 1), the token budget (a text
longer than the whole budget is rejected; otherwise the oldest lowest-utility lessons make room), and the
curator (a near-duplicate of a lesson already there is reported and not added twice; one that contradicts
a similar lesson replaces it). The lessons are stored with provenance "user" (lesson metadata source=user,
an extraction by "user" without episodes) and make ONE new lesson-set version:
- live at once when the run's gate is off (lessons.gate_episodes: 0, or lessons.enabled: false);
- with the gate on, a candidate: the gate needs the policy and the environments, so the loop plays it
  as soon as it runs again (agent-runtime run CONFIG --resume), before it plays an episode.
With --config and no run of that name in the store, the run is created from the config (with its
lessons.seed), so that `agent-runtime run CONFIG --resume --workdir W` continues it."""

RETIRE_HELP = """Take lessons out of the live set: a new live version without them (and a pending candidate
is written again without them); their status becomes retired. A lesson added to several pools has one id
per pool (see `lessons list`). An unknown id, or a lesson of another run or not in the live set, is an
error and nothing is written."""


def register(sub) -> None:
    memory = sub.add_parser("memory", help="inspect and maintain the experience memory")
    msub = memory.add_subparsers(dest="memory_cmd", required=True)

    def command(parent, name, func, help_text, description=None):
        p = parent.add_parser(name, help=help_text, description=description,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        add_store_args(p)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)
        return p

    command(msub, "stats", cmd_stats, "counts of runs, episodes, steps, lessons")
    command(msub, "export", cmd_export, "write the whole store as versioned JSONL").add_argument(
        "path", help="output file, or - for stdout")
    command(msub, "import", cmd_import, "read a JSONL export into the store (all or nothing)").add_argument("path")
    command(msub, "reindex", cmd_reindex, "recompute missing vectors and rebuild every FAISS index from SQL")
    search = command(msub, "search", cmd_search, "semantic search over lessons or episodes")
    search.add_argument("query")
    search.add_argument("--kind", choices=("lessons", "episodes"), default="lessons")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--run", type=int)
    search.add_argument("--env")

    lessons = sub.add_parser("lessons", help="the agent's lessons: list, provenance, versions")
    lsub = lessons.add_subparsers(dest="lessons_cmd", required=True)
    ls = command(lsub, "list", cmd_lessons_list, "the live lesson set (or every lesson with --status)")
    ls.add_argument("--run", type=int)
    ls.add_argument("--status", choices=("proposed", "active", "consolidated", "retired"))
    show = command(lsub, "show", cmd_lessons_show, "one lesson with its provenance")
    show.add_argument("lesson_id", type=int)
    diff = command(lsub, "diff", cmd_lessons_diff, "what changed between two lesson-set versions")
    diff.add_argument("old", type=int)
    diff.add_argument("new", type=int)
    diff.add_argument("--run", type=int)
    rollback = command(lsub, "rollback", cmd_lessons_rollback, "make an earlier lesson-set version live again")
    rollback.add_argument("version", type=int)
    rollback.add_argument("--run", type=int)
    add = command(lsub, "add", cmd_lessons_add, "add lessons written by a person to every pool of a run",
                  description=ADD_HELP)
    add.add_argument("text", nargs="+", help="one lesson per argument: one general rule in one sentence")
    add.add_argument("--run", type=int, help="the run (default: the run of --config's name, else the newest)")
    add.add_argument("--config", type=Path, help="a run config: its run is used, or created if the store has none")
    retire = command(lsub, "retire", cmd_lessons_retire, "take lessons out of the live set (a new version)",
                     description=RETIRE_HELP)
    retire.add_argument("lesson_ids", nargs="+", type=int, metavar="ID", help="lesson ids (see `lessons list`)")
    retire.add_argument("--run", type=int)
