"""One run per name in a store: a new run (no `--resume`) is never started beside a run of the same name.

A second run of a name would play without what the first one holds (the lessons a person gave it with `lessons add
--config`, its adapter), and nothing would say so; and `--resume`, `eval`, `distill` and the `lessons` commands find
a run by its name, so they would see only the newer one from then on. So when the store already holds a run of the
config's name:

- one that has not played yet (no episode committed: `lessons add --config` creates one so that its lessons are
  gated before the first game, and so does a system-prompt `distill`) is continued, as `--resume` would continue
  it, with the same checks of the given config against the stored one;
- one that has played is refused (`RunExistsError`), with the command that continues it; nothing is written.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from agent_runtime.config import ConfigError, RunConfig
from agent_runtime.state import RunState
from memory import ExperienceStore

log = logging.getLogger("agent_runtime.run.names")


class RunExistsError(ConfigError):
    """A new run was asked for where a run of that name has played: it is refused, and the message says how to
    continue that one (`with_command` puts the exact command line in it)."""

    def __init__(self, run_id: int, name: str, episodes: int, url: str, resume: str = "") -> None:
        self.run_id, self.name, self.episodes, self.url = run_id, name, episodes, url
        how = resume or "the same command with --resume"
        played = f"{episodes} episode{'s' if episodes != 1 else ''}"
        super().__init__(
            f"run {run_id} ({name!r}) in {url} has played {played}; a second run of that name is never "
            f"started beside it (it would play without what this one holds, its lessons and adapter). Continue it: "
            f"{how}; or start a new run under another name (--set name=NEW) or in another workdir"
        )

    def with_command(self, command: str) -> RunExistsError:
        """The same refusal, naming `command` as the way to continue the run."""
        return RunExistsError(self.run_id, self.name, self.episodes, self.url, command)


def episodes_played(store: ExperienceStore, run) -> int:
    """How many episodes `run` has committed (at least 1 when its state lost count but an episode is stored)."""
    return RunState.from_stored(run.state).episodes or len(store.episodes(run.id, limit=1))


def continues_existing(config: RunConfig, workdir: Path) -> bool:
    """For a run started without `--resume`: True when the store holds a run of `config.name` that has not played
    (the caller continues it, as `--resume`), False when it holds none; RunExistsError when one has played. A
    workdir without a store holds no run, and none is created here."""
    if config.memory.url is None and not (Path(workdir) / "memory.db").exists():
        return False
    with ExperienceStore.open(config.memory.url or workdir) as store:
        run = store.find_run(config.name)
        if run is None:
            return False
        played, url = episodes_played(store, run), store.url
    if played:
        raise RunExistsError(run.id, run.name, played, url)
    note = (
        f"continuing run {run.id} ({run.name!r}) in {url}, which has not played yet (`lessons add --config` "
        "creates one): its lessons and adapter are used, as with --resume"
    )
    log.warning(note)
    print(note, file=sys.stderr)
    return True
