"""Smoke test of the tree-scoring benchmark: `bench/tree_scoring.py --quick` plays the same episodes with both
scorings, in a process each, and reports what each decision computed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import ROOT


@pytest.mark.slow
def test_tree_scoring_bench_quick_plays_the_same_episodes_both_ways(tmp_path, games_dir):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tree_scoring.py"), "--quick", "--games-dir", str(games_dir)]
        + ["--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "outcomes identical" in proc.stdout
    flat, tree = json.loads(out.read_text())
    assert (flat["scoring"], tree["scoring"]) == ("flat", "tree")
    assert flat["outcomes_sha"] == tree["outcomes_sha"] and len(flat["decisions"]) == len(tree["decisions"]) > 0
    for f, t in zip(flat["decisions"], tree["decisions"]):
        assert f["actions"] == t["actions"] and f["columns"] == f["whole_tokens"] >= t["columns"] > 0
        assert t["cpu_s"] > 0 and t["prefilled"] >= 0
    assert tree["peak_mb"] > 0
