"""The TALES suite on the runtime's evaluation: its games as config entries (TWX's as the built-ins `tales/<name>`),
TALES' score, and bench/tales.py end to end on the scripted backend."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import environments
from agent_runtime.evaluation.tales import TalesGame, framework_means, normalized_score, suite
from tests import ROOT


def test_tales_suite_lists_the_games_with_tales_parameters():
    games = suite()
    twx_games = [g for g in games if g.framework == "twx"]
    science = [g for g in games if g.framework == "scienceworld"]
    assert len(twx_games) == 16 and len(science) == 30
    by_name = {g.name: g.entry for g in games}
    assert len({entry["id"] for entry in by_name.values()}) == 46  # every game its own id: one config holds them all
    registered = {r.id for r in environments.list_envs()}
    assert all(game.entry["id"] in registered for game in games)  # built-ins: nothing to register first
    assert by_name["TWXCoinCollector"] == {"id": "tales/TWXCoinCollector", "max_steps": 100, "kwargs": {}}
    assert by_name["ScienceWorldBoil"]["kwargs"] == {"admissible_actions": False}
    assert suite(("scienceworld",), mode="choice")[0].entry["kwargs"] == {}
    with pytest.raises(ValueError, match="accepted: twx, scienceworld"):
        suite(("jericho",))
    with pytest.raises(ValueError, match="mode must be"):
        suite(mode="react")


def test_tales_score_is_the_best_score_reached_over_the_maximum():
    assert normalized_score([{"score": 20.0, "max_score": 100.0}, {"score": 60.0}, {"score": -100.0}]) == 0.6
    assert normalized_score([{"score": -5.0, "max_score": 100.0}]) == 0.0
    assert normalized_score([{"won": True}]) == 1.0 and normalized_score([]) == 0.0
    games = [TalesGame("a", "twx", {}), TalesGame("b", "twx", {}), TalesGame("c", "scienceworld", {})]
    assert framework_means({"a": 1.0, "b": 0.5}, games) == {"twx": (0.75, 2)}


@pytest.mark.slow
def test_tales_bench_plays_resumes_and_prints_the_table(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "bench" / "tales.py"),
        "--limit",
        "1",
        "--steps",
        "3",
        "--modes",
        "choice",
        "--workdir",
        str(tmp_path),
        "--set",
        "model.backend=scripted",
    ]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[choice 1/2] TWXCookingWorld" in first.stdout and "[choice 2/2] ScienceWorldBoil" in first.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results) == 2 and all(0.0 <= r["score"] <= 1.0 and 1 <= r["steps"] <= 3 for r in results.values())
    assert "| Llama-3.1-8B-Instruct (TALES leaderboard) | TALES' harness | 50.3% | 15.7% |" in first.stdout
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0 and "[choice" not in again.stdout  # nothing replayed
    assert "(1/1 games) | " in again.stdout and "choice among admissible (ours)" in again.stdout
