"""The `agent-runtime` commands: `commands` (main, the parser, run/eval/distill/envs/setup/dashboard), `lessons`,
`memory`, `report`, `common` (what they share) and `dry_run` (`run --dry-run`)."""

from agent_runtime.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
