"""The experiential agent runtime: an LLM agent that plays text games and solves math problems, remembers
every trajectory, extracts lessons from them, and consolidates those lessons into its weights (OPCD).

This package holds the runtime side, a room per concern: `config` and `checkpoints`; `llm/` (policy backends);
`episode/` (the prompt, the runner); `run/` (the loop, its state, executors, the `Run` object); `phases/` (EXTRACT,
the OPCD cycle, the adapter probe); `evaluation/` (held-out evaluation, the held-out set, the learning table);
`cli/` (the commands, the dry run); `dashboard/`. Environments, the experience memory and distillation live in the
sibling packages `environments`, `memory` and `distill`.

The modules that lived directly in this folder before the rooms keep importing under their old names
(`agent_runtime.loop` is `agent_runtime.run.loop`, the same module object): `MOVED` lists them.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

MOVED = {
    "loop": "run.loop",
    "play": "run.play",
    "ray_executor": "run.ray_executor",
    "cursor": "run.cursor",
    "profile": "run.profile",
    "lessons_phase": "phases.extract",
    "consolidate": "phases.consolidate",
    "adapter_probe": "phases.probe",
    "decisions": "phases.decisions",
    "system_prompt": "phases.system_prompt",
    "heldout": "evaluation.heldout",
    "report": "evaluation.report",
    "agent": "episode.prompt",
    "runner": "episode.runner",
    "envs": "episode.build",
    "retrieved_examples": "episode.examples",
    "cli_common": "cli.common",
    "cli_lessons": "cli.lessons",
    "cli_memory": "cli.memory",
    "dry_run": "cli.dry_run",
}


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import agent_runtime.<old>` gives the module at its new place (nothing is imported twice)."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.rpartition(".")
        if prefix != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}")
        spec.loader_state = module.__spec__  # importing under the old name sets __spec__: exec_module puts it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # already executed under its new name


sys.meta_path.append(_OldNames())
