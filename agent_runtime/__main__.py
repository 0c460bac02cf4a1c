"""`python -m agent_runtime` is the `agent-runtime` command."""

from agent_runtime.cli import main

raise SystemExit(main())
