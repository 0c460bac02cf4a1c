"""The experiential agent runtime: an LLM agent that plays text games and solves math problems, remembers
every trajectory, extracts lessons from them, and consolidates those lessons into its weights (OPCD).

This package holds the runtime side: configuration, policy backends, the agent (prompt assembly and action
parsing), the episode runner, the long-lived loop and the CLI. Environments, the experience memory and
distillation live in the sibling packages `environments`, `memory` and `distill`.
"""

__version__ = "0.1.0"
