"""The experiential agent runtime: an LLM agent that plays text games and solves math problems, remembers
every trajectory, extracts lessons from them, and consolidates those lessons into its weights (OPCD).

This package holds the runtime side, a room per concern, each importing only rooms on a lower floor
(tests/test_layout.py holds the floors): `checkpoints` and `curriculum`; `llm/` (policy backends); `config`;
`episode/` (the prompt, the runner); `evaluation/` (held-out evaluation, the held-out set, the learning table);
`state/` (the `Run`, its cursor and profile); `phases/` (EXTRACT, the OPCD cycle, the adapter probe); `run/` (the
loop, its executors, resume); `cli/` (the commands, the dry run) and `dashboard/`. Environments, the experience
memory and distillation live in the sibling packages `environments`, `memory` and `distill`.
"""

__version__ = "0.1.0"
