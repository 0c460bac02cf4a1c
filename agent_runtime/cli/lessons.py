"""The `lessons` commands: the agent's lessons, their provenance and versions, and a person's own lessons.

    agent-runtime lessons list|show|diff|rollback [--workdir DIR | --db URL] [--run ID] [--json]
    agent-runtime lessons add TEXT [TEXT ...] [--workdir DIR | --db URL] [--run ID] [--config CONFIG.yaml]
                              [--env ID ...] [--json]
    agent-runtime lessons retire ID [ID ...] [--workdir DIR | --db URL] [--run ID] [--json]
    agent-runtime lessons forget ID [--workdir DIR | --db URL] [--yes] [--json]

`list`, `show` and `diff` open the store read-only; `rollback`, `add`, `retire` and `forget` write. The run a command
acts on is `--run ID`, else the newest run in the store (`lessons add --config`: the run of that config's
name, created from the config if the store has none, so that `agent-runtime run CONFIG` on that workdir continues
it: a run that has not played is continued, never doubled, `agent_runtime.run.names`). `lessons add` exits 1 when a
text was rejected (the others still go in).
"""

from __future__ import annotations

from pathlib import Path

from agent_runtime.cli.common import UsageError, add_command, open_store, print_result, shown


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
    from distill.lessons.scope import describe_scope

    with open_store(args) as store:
        run_id = _run_id(store, args)
        if args.status:
            version, lessons = None, store.lessons(run_id, status=args.status)
        else:
            version, lessons = live_lessons(store, run_id)
    rows = [
        {
            "id": x.id,
            "pool": x.pool,
            "status": x.status,
            "text": x.text,
            "scope": list(x.scope),
            "sources": x.source_episode_ids,
            "source": x.metadata.get("source", "extracted"),
            "times_in_context": x.times_in_context,
        }
        for x in lessons
    ]
    head = (
        f"run {run_id}, lesson set v{version.version} ({len(rows)} lessons)"
        if version is not None
        else f"run {run_id}: {len(rows)} lessons"
    )
    print_result(
        args,
        {"run_id": run_id, "version": version.version if version else None, "lessons": rows},
        [head]
        + [
            f"#{r['id']:<5} pool {r['pool']} [{r['status']}]{' (user)' if r['source'] == 'user' else ''} "
            f"({shown(describe_scope(r['scope']))}) {shown(r['text'])}"
            for r in rows
        ],
    )
    return 0


def _together_line(trial: dict) -> str:
    """A trial's combination, when the lesson's own trial let it in beside others: what they did together."""
    together = trial.get("together")
    if not together:
        return ""
    others = " ".join(f"#{i}" for i in together["with"])
    return f"; together with {others}: {together['current_rate']:.2f} -> {together['candidate_rate']:.2f}"


def cmd_lessons_show(args) -> int:
    from distill.lessons import lesson_provenance
    from distill.lessons.scope import describe_scope

    with open_store(args) as store:
        info = lesson_provenance(store, args.lesson_id)
    lines = [f"lesson #{info['id']} [{info['status']}] pool {info['pool']}: {shown(info['text'])}"]
    lines.append(f"  scope: {shown(describe_scope(info['scope']))}")
    proposed, trials = info["metadata"].get("proposed_scope"), info["metadata"].get("scope_trials")
    if trials:  # the gate narrowed it to the environments whose trial let it in
        lines.append(f"  proposed for {shown(describe_scope(proposed))}; trial per environment:")
        lines += [
            f"    {shown(env)}: {'let in' if env in info['scope'] else 'kept out'}, success "
            f"{d['current_rate']:.2f} -> {d['candidate_rate']:.2f} on {d['n']} paired games{_together_line(d)}"
            for env, d in trials.items()
        ]
    if info.get("extraction"):
        lines.append(f"  extraction #{info['extraction']['id']} ({info['extraction']['extractor']})")
    evidence, trial = info["metadata"].get("evidence"), info["metadata"].get("trial")
    if evidence:  # an induced lesson: what it rests on
        lines.append(
            f"  evidence: {shown(evidence['summary'])}; won episodes {evidence['won_episode_ids']}, "
            f"lost episodes {evidence['lost_episode_ids']}"
        )
    if trial:
        verdict = "went live" if info["metadata"].get("accepted") else "kept out"
        lines.append(
            f"  trial ({verdict}): success {trial['current_rate']:.2f} -> {trial['candidate_rate']:.2f} "
            f"on {trial['n']} paired train games (delta {trial['delta']:+.2f}, 95% CI "
            f"{trial['delta_ci'][0]:+.2f} to {trial['delta_ci'][1]:+.2f})"
        )
    if info.get("utility") is not None:
        lines.append(f"  measured utility in play: {info['utility']:+.2f} (success with it in context minus without)")
    for ep in info["source_episodes"]:
        lines.append(
            f"  from episode {ep['id']}: {shown(ep['env_id'])} {shown(ep['task_id'])} {ep['outcome']} "
            f"({ep['num_steps']} steps)"
        )
    for parent in info.get("ancestry", []):
        lines.append(f"  {parent['relation']} #{parent['id']}: {shown(parent['text'])}")
    print_result(args, info, lines)
    return 0


def cmd_lessons_diff(args) -> int:
    from distill.lessons import diff_versions

    with open_store(args) as store:
        diff = diff_versions(store, _run_id(store, args), args.old, args.new).to_dict()
    lines = [f"v{diff['old']} -> v{diff['new']}"]
    lines += [f"+ #{x['id']} {shown(x['text'])}" for x in diff["added"]]
    lines += [f"- #{x['id']} {shown(x['text'])}" for x in diff["removed"]]
    lines += [f"  merged #{a} into #{b}" for a, b in diff["merged"]]
    lines += [f"  updated #{a} -> #{b}" for a, b in diff["updated"]]
    print_result(args, diff, lines)
    return 0


def _run_config(run):
    from agent_runtime.config import config_from_dict

    return config_from_dict(run.config, source=f"the stored config of run {run.id}", stored=True)


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
        from agent_runtime.run.loop import default_workdir

        workdir = default_workdir(config.name)
    else:
        workdir = Path(".")
    if not (workdir / "memory.db").exists():
        if config is None:
            raise UsageError(
                f"no run in {workdir} (no memory.db): pass --config CONFIG.yaml to create the run, "
                f"or start one first (agent-runtime run CONFIG --workdir {workdir})"
            )
        workdir.mkdir(parents=True, exist_ok=True)
    return str(workdir)


def _families(args, run_config) -> list[str] | None:
    """The prompt families of the run's environments, when `--env` names a family (known only by building each
    environment once, so only then); None otherwise."""
    from distill.lessons.scope import FAMILY

    if not any(entry.startswith(FAMILY) for entry in args.env):
        return None
    from agent_runtime.episode.build import build_envs
    from agent_runtime.run.loop import default_workdir

    workdir = args.workdir or (default_workdir(run_config.name) if args.db is None else Path("."))
    specs, _ = build_envs(run_config, Path(workdir))
    return [spec.family for spec in specs]


def cmd_lessons_add(args) -> int:
    from agent_runtime.config import load_config
    from agent_runtime.phases.extract import add_lessons, add_seed_lessons
    from distill.lessons.scope import GLOBAL, ScopeError, normalize_scope
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
                raise UsageError(
                    f"no run in {store.url}: pass --config CONFIG.yaml to create one, or start a run "
                    "first (agent-runtime run CONFIG)"
                )
            run = runs[-1]
        run_config = _run_config(run)
        spec = run_config.lessons.embedder or run_config.memory.embedder
        embedder = make_embedder(spec) if spec else None
        try:
            known = [e.id for e in run_config.envs]
            scope = normalize_scope(args.env, known, _families(args, run_config)) if args.env else GLOBAL
        except ScopeError as exc:
            raise UsageError(f"--env: {exc}") from None
        seeded = add_seed_lessons(run_config, store, run.id) if created else None
        result = add_lessons(run_config, store, run.id, args.text, embedder=embedder, note="lessons add", scope=scope)
    payload = {**result.to_dict(), "created_run": created, "seed": seeded.to_dict() if seeded is not None else None}
    head = [
        f"created run {run.id} ({run.name}) from {args.config}: `agent-runtime run {args.config}` on this workdir "
        "plays it, with these lessons"
        if created
        else f"run {run.id} ({run.name})"
    ]
    print_result(args, payload, head + result.lines())
    return 1 if result.rejected else 0


def cmd_lessons_retire(args) -> int:
    from agent_runtime.phases.extract import config_token_counter
    from distill.lessons import retire_lessons

    with open_store(args, read_only=False) as store:
        run_id = _run_id(store, args)
        count_tokens = config_token_counter(_run_config(store.get_run(run_id)).model)
        result = retire_lessons(store, run_id, args.lesson_ids, count_tokens=count_tokens, note="lessons retire")
    print_result(args, result.to_dict(), result.lines())
    return 0


def cmd_lessons_forget(args) -> int:
    from agent_runtime.phases.extract import config_token_counter
    from distill.lessons.forget import apply_forget, plan_forget

    with open_store(args, read_only=False) as store:
        plan = plan_forget(store, args.lesson_id)
        lines = plan.lines()
        payload = {
            "run_id": plan.run_id,
            "forgotten": plan.forgotten,
            "derived": plan.derived,
            "tainted_cycles": [c.id for c in plan.tainted_cycles],
            "tainted_adapters": [a.id for a in plan.tainted_adapters],
            "rolls_back": plan.rolls_back,
            "fallback_adapter": plan.fallback.id if plan.fallback else None,
            "restored": plan.restored,
            "kept_text": plan.kept_text,
            "back_in_place": plan.back_in_place,
            "applied": False,
        }
        if plan.rolls_back and not args.yes:
            refusal = "nothing was changed: this rolls back the run's adapter; pass --yes to do it"
            print_result(args, payload, [*lines, refusal])
            return 2
        count_tokens = config_token_counter(_run_config(store.get_run(plan.run_id)).model)
        done = apply_forget(store, plan, count_tokens=count_tokens)
    payload.update(applied=True, **done)
    print_result(
        args,
        payload,
        [
            *lines,
            f"done: new lesson-set versions {done['versions'] or 'none'}"
            + (f", run request #{done['request_id']}" if done["request_id"] else ""),
        ],
    )
    return 0


def cmd_lessons_rollback(args) -> int:
    from distill.lessons import restore_version
    from distill.lessons.versions import forgotten_since, get_version

    with open_store(args, read_only=False) as store:
        run_id = _run_id(store, args)
        left_out = forgotten_since(store, run_id, get_version(store, run_id, args.version).lesson_ids)
        info = restore_version(store, run_id, args.version, note=f"rollback to v{args.version} from the CLI")
    line = f"run {run_id}: lesson set v{args.version} restored as v{info.version}"
    if left_out:  # a forgotten lesson never comes back
        line += " without " + ", ".join(f"#{i}" for i in left_out) + ", which was forgotten (`lessons forget`)"
    print_result(
        args,
        {"run_id": run_id, "restored": args.version, "new_version": info.version, "left_out": left_out},
        [line],
    )
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
lessons.seed), so that `agent-runtime run CONFIG --resume --workdir W` continues it.

Scope: --env ID (repeatable) says which of the run's environments the lessons are for; an id the run does not
have is an error naming the run's environments. Without --env a lesson is proposed for every environment: the
gate tries it in each, and it goes live only in those where it raised success (never where it lowered it); with
--env the gate's own rule applies in the named ones. With the gate off a lesson is live at once in its scope."""

RETIRE_HELP = """Take lessons out of the live set: a new live version without them (and a pending candidate
is written again without them); their status becomes retired. A lesson added to several pools has one id
per pool (see `lessons list`). An unknown id, or a lesson of another run or not in the live set, is an
error and nothing is written."""


FORGET_HELP = """Forget a lesson everywhere it went. It (and every lesson merged or updated from it) leaves the
live set and a pending candidate (new versions) and is marked forgotten. A merge keeps its older source's text:
when that source is not the forgotten lesson, the source comes back as its own lesson in the merge's place
(forget it too to remove that text). If an adapter was trained with its text
in the teacher's context (a promoted cycle distilled a lesson set holding it), that adapter and every adapter
trained on top of it are tainted; when the run acts with a tainted adapter, it goes back to the newest
ancestor trained without it (or the base model), the lessons the tainted cycles had consolidated come back
into the context, and a re-consolidation of the live lessons on top of that ancestor is scheduled: the
loop runs it as its next CONSOLIDATE, `agent-runtime distill` runs it now. The command prints what it undoes
and changes nothing that rolls back an adapter without --yes (exit 2)."""


def register(sub) -> None:
    lessons = sub.add_parser("lessons", help="the agent's lessons: list, provenance, versions")
    lsub = lessons.add_subparsers(dest="lessons_cmd", required=True)
    ls = add_command(lsub, "list", cmd_lessons_list, "the live lesson set (or every lesson with --status)")
    ls.add_argument("--run", type=int)
    ls.add_argument("--status", choices=("proposed", "active", "consolidated", "retired"))
    show = add_command(lsub, "show", cmd_lessons_show, "one lesson with its provenance")
    show.add_argument("lesson_id", type=int)
    diff = add_command(lsub, "diff", cmd_lessons_diff, "what changed between two lesson-set versions")
    diff.add_argument("old", type=int)
    diff.add_argument("new", type=int)
    diff.add_argument("--run", type=int)
    rollback = add_command(lsub, "rollback", cmd_lessons_rollback, "make an earlier lesson-set version live again")
    rollback.add_argument("version", type=int)
    rollback.add_argument("--run", type=int)
    add = add_command(
        lsub, "add", cmd_lessons_add, "add lessons written by a person to every pool of a run", description=ADD_HELP
    )
    add.add_argument("text", nargs="+", help="one lesson per argument: one general rule in one sentence")
    add.add_argument("--run", type=int, help="the run (default: the run of --config's name, else the newest)")
    add.add_argument("--config", type=Path, help="a run config: its run is used, or created if the store has none")
    add.add_argument(
        "--env",
        action="append",
        metavar="ID",
        help="an environment of the run the lessons are for (repeatable; family:NAME for a family); without it they "
        "are proposed for every environment and, with the gate on, go live where their trial raised success",
    )
    retire = add_command(
        lsub, "retire", cmd_lessons_retire, "take lessons out of the live set (a new version)", description=RETIRE_HELP
    )
    retire.add_argument("lesson_ids", nargs="+", type=int, metavar="ID", help="lesson ids (see `lessons list`)")
    retire.add_argument("--run", type=int)
    forget = add_command(
        lsub, "forget", cmd_lessons_forget, "forget a lesson from the context and the weights", description=FORGET_HELP
    )
    forget.add_argument("lesson_id", type=int, metavar="ID")
    forget.add_argument("--yes", action="store_true", help="do it even when it rolls back the run's adapter")
