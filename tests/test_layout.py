"""agent_runtime in rooms: the modules that lived directly in agent_runtime/ keep importing under their old names,
as the same module objects as at their new places (one copy of each module's state)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import agent_runtime


@pytest.mark.parametrize("old", sorted(agent_runtime.MOVED))
def test_an_old_module_name_is_the_module_at_its_new_place(old):
    new = importlib.import_module(f"agent_runtime.{agent_runtime.MOVED[old]}")
    assert importlib.import_module(f"agent_runtime.{old}") is new
    assert new.__spec__.name == new.__name__ == f"agent_runtime.{agent_runtime.MOVED[old]}"


def test_old_imports_in_a_fresh_process():
    """`from agent_runtime.loop import AgentLoop` and friends, before anything imported the new places."""
    code = (
        "from agent_runtime.loop import AgentLoop\n"
        "from agent_runtime.consolidate import run_cycle, decide_promotion\n"
        "from agent_runtime import play\n"
        "import agent_runtime.run.loop as loop\n"
        "assert AgentLoop is loop.AgentLoop and play.__name__ == 'agent_runtime.run.play'\n"
        "assert run_cycle.__module__ == 'agent_runtime.phases.consolidate'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_name_that_never_was_a_module_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("agent_runtime.no_such_module")
