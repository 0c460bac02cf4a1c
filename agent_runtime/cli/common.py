"""What the store commands (`memory ...`, `lessons ...`, `dashboard`) share: where the store is, how to open it,
how a result is printed, and the user-facing error they raise.

Stored text (lessons, episodes' goals, environment descriptions, error messages that quote them) came from
an environment, a model or a file someone edited; printed raw, an escape sequence in it would drive the
terminal (move the cursor, rewrite earlier lines, set the clipboard with OSC 52). `shown(text)`
(`agent_runtime.terminal`) is the one helper every command prints such text through; `print_result` applies it
to every line it prints (keeping newlines and tabs) and `--json` output escapes them as JSON does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm.auto import tqdm

from agent_runtime.terminal import shown


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


def print_result(args, payload, text_lines) -> None:
    """`--json`: the payload as JSON (ASCII, every control character escaped); else the lines, each through
    `shown` (newlines and tabs kept)."""
    if args.json:
        print(json.dumps(payload, default=str))
    else:
        for line in text_lines:
            print(shown(line, multiline=True))


def progress_bars():
    bars: dict[str, tqdm] = {}

    def update(what: str, done: int, total: int) -> None:
        bar = bars.get(what) or bars.setdefault(what, tqdm(total=total, desc=what, unit="item", leave=False))
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bars


def add_command(parent, name: str, func, help_text: str, description: str | None = None) -> argparse.ArgumentParser:
    """A store subcommand: `--workdir`/`--db` to find the store, `--json` for machine-readable output."""
    p = parent.add_parser(
        name, help=help_text, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_store_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=func)
    return p
