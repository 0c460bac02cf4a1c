"""The test suite: one folder per package and room of the code (tests/agent_runtime/run/ tests agent_runtime/run/),
the cross-cutting checks (the import floors, lint) at the top. `ROOT` is the repository, `TESTS` this folder (its
data/ and scripts/ are shared by the rooms' tests)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
