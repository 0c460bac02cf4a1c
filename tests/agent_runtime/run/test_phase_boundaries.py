"""A run killed (SIGKILL) at any phase boundary, or inside a phase, and resumed stores exactly what an
uninterrupted run stores: no EXTRACT twice (no second set of extractions, versions or gate decisions), no
second OPCD cycle after a promotion, no episode lost or repeated. Each phase writes its results and the
cursor's move in one transaction; a cycle killed while training is rolled back and run again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_runtime.run.loop import AgentLoop
from memory import ExperienceStore
from tests import TESTS

SCRIPT = TESTS / "scripts" / "kill_at.py"


def contents(workdir: Path) -> dict:
    with ExperienceStore.open(workdir) as store:
        [run] = store.runs()
        cycles = store.cycles(run.id)
        return {
            "draws": sorted(e.metadata["draw"] for e in store.episodes(run.id, limit=1000)),
            "extractions": len(store.extractions(run.id, limit=1000)),
            "lesson_sets": len(store.lesson_sets(run.id)),
            # how many cycles ended (promoted or not: that depends on sampling, which a resume re-seeds)
            "finished_cycles": sum(not (c.error or "").startswith("interrupted") for c in cycles),
            "phase": run.phase,
            "status": run.status,
            "state": {k: run.state[k] for k in ("episodes", "extractions", "cycles")},
        }


_REFERENCE: dict[str, dict] = {}


@pytest.fixture
def reference(tmp_path_factory, cycle_config) -> dict:
    """What the uninterrupted run stores (run once per session)."""
    if not _REFERENCE:
        workdir = tmp_path_factory.mktemp("uninterrupted")
        loop = AgentLoop(cycle_config(), workdir, progress=False)
        loop.run()
        loop.close()
        _REFERENCE["run"] = contents(workdir)
    return _REFERENCE["run"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "point", ["after-play", "inside-extract", "after-extract", "inside-consolidate", "after-consolidate"]
)
def test_a_kill_at_any_point_then_resume_stores_what_an_uninterrupted_run_does(
    point, tmp_path, reference, cycle_config
):
    config = cycle_config()
    (tmp_path / "config.json").write_text(json.dumps(config.model_dump(mode="json")))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "config.json"), str(tmp_path / "run"), point],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == -9, f"not killed at {point}: {proc.returncode}\n{proc.stderr[-3000:]}"
    loop = AgentLoop(config, tmp_path / "run", resume=True, progress=False)
    loop.run()
    loop.close()
    assert contents(tmp_path / "run") == reference
