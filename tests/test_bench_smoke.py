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
        [
            sys.executable,
            str(ROOT / "bench" / "rollout.py"),
            "--quick",
            "--threads",
            "1",
            "--games-dir",
            str(games_dir),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
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
        shares = [
            row[k]
            for k in (
                "share_model_generate",
                "share_backend_overhead",
                "share_prompt_build",
                "share_env",
                "share_other",
            )
        ]
        assert abs(sum(shares) - 1.0) < 1e-6 and min(shares[:4]) >= 0
        assert 0 < row["share_prefill"] <= row["share_model_generate"]
    assert rows[1]["mean_batch"] == 1.0
    assert rows[4]["mean_batch"] > 1.0  # the four slots really were batched into one generate call


def _gpu_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_sections_run_in_cpu_dry_run(tmp_path, capsys):
    gpu_check = _gpu_check()
    results = tmp_path / "rows.jsonl"
    dry = ["--results", str(results), "--cpu-dry-run"]
    assert gpu_check.main(["hf-generate", "--batches", "2", *dry]) == 0
    assert gpu_check.main(["rollout", "--slots", "2", "--synthetic", *dry]) == 0
    assert gpu_check.main(["opcd", *dry]) == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["section"] for r in rows] == ["hf-generate", "rollout", "opcd"]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert "synthetic text env" in rows[1]["notes"] and "2 episodes x 2 steps (4 steps)" in rows[1]["notes"]
    assert rows[2]["setting"] == "OPCD, default config" and 0 <= rows[2]["mfu"] < 1
    capsys.readouterr()
    assert gpu_check.main(["report", "--results", str(results)]) == 0
    table = capsys.readouterr().out
    assert table.count("\n") == len(rows) + 2 and "| opcd | OPCD, default config |" in table


def test_loop_profile_bench_sets_each_phase_against_its_floor(
    tmp_path, games_dir, tiny_model_dir, cycle_config, capsys
):
    """`bench/loop.py` on a whole cycle of the tiny model: every phase that ran has its row, a floor from the
    same model's measured rates, and the JSON beside the table; then the memory table: each phase's peak against
    its floor, and what the live objects held at the sampled high."""
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("loop_bench", ROOT / "bench" / "loop.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    config = tmp_path / "cycle.yaml"
    config.write_text(yaml.safe_dump(cycle_config().model_dump(mode="json")))
    workdir = tmp_path / "w"
    argv = ["--config", str(config), "--workdir", str(workdir), "--no-progress", "--sample-s", "0.02"]
    assert bench.main(argv) == 0
    saved = json.loads((workdir / "profile.json").read_text())
    assert saved["rates"]["forward"] > 0 and saved["rates"]["train"] > 0
    out = capsys.readouterr().out
    time_table, memory_table = out.split("floor: the process with its imports")
    rows = {line.split(" | ")[0][2:]: line for line in time_table.splitlines() if line.startswith("| ")}
    assert "EXTRACT" in rows  # its fake extractor puts nothing through the model: no floor
    for phase in ("PLAY", "CONSOLIDATE", "CONSOLIDATE: train", "CONSOLIDATE: evaluate"):
        assert rows[phase].rstrip(" |").endswith("x"), rows[phase]  # model work: a floor and a ratio
    assert saved["profile"]["CONSOLIDATE: train"]["train_tokens"] > 0
    memory = {
        line.split(" | ")[0][2:]: line.split(" | ") for line in memory_table.splitlines() if line.startswith("| ")
    }
    profile = saved["profile"]
    for phase in ("PLAY", "CONSOLIDATE", "CONSOLIDATE: train"):
        assert float(memory[phase][1]) == pytest.approx(profile[phase]["peak_rss_mb"], abs=1)
        assert profile[phase]["peak_rss_mb"] >= profile[phase]["end_rss_mb"] > 0
    assert profile["CONSOLIDATE"]["peak_rss_mb"] >= profile["CONSOLIDATE: train"]["peak_rss_mb"]
    floors = saved["memory_floors"]
    assert floors["base"] > 0 and floors["weights"] > 0 and floors["train"] > 0
    # the sampler took an inventory at PLAY's high: the tiny model's weights, counted once
    held = saved["at_peak"]["PLAY"]
    assert held["model copies"] >= 1 and held["weights"] > 0 and held["rss_mb"] > 0
