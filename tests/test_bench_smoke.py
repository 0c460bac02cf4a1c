"""Smoke test of the rollout benchmark: `bench/rollout.py --quick` runs end to end and its numbers add up.

The benchmark is a script, not a library, so nothing else would notice when a runtime change breaks it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_rollout_bench_quick_prints_a_consistent_table(tmp_path, games_dir):
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rollout.py"), "--quick", "--threads", "1",
         "--games-dir", str(games_dir), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| tiny | 1 | 4 |" in proc.stdout and "| tiny | 4 | 4 |" in proc.stdout
    rows = {row["slots"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {1, 4}
    for slots, row in rows.items():
        assert row["episodes"] == 4
        assert 4 <= row["steps"] <= 8  # 4 episodes of at most 2 steps
        assert row["gen_tokens_per_s"] > 0 and row["wall_s"] > 0
        assert row["mean_batch"] <= slots
        shares = [row[k] for k in ("share_model_generate", "share_backend_overhead", "share_prompt_build",
                                   "share_env", "share_other")]
        assert abs(sum(shares) - 1.0) < 1e-6 and min(shares[:4]) >= 0
        assert 0 < row["share_prefill"] <= row["share_model_generate"]
    assert rows[1]["mean_batch"] == 1.0
    assert rows[4]["mean_batch"] > 1.0  # the four slots really were batched into one generate call
