"""Smoke test of the rollout benchmark: `bench/rollout.py --quick` runs end to end and its numbers add up.

The benchmark is a script, not a library, so nothing else would notice when a runtime change breaks it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import ROOT


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


@pytest.mark.slow
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
    assert saved["profile"]["CONSOLIDATE: train"]["scored_tokens"] > 0  # the held-out KL's student forwards
    # the floor's training step is the run's: checkpointed as its trainer is
    assert saved["rates"]["checkpointed"] is cycle_config().opcd.trainer.gradient_checkpointing
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


@pytest.mark.slow
def test_memory_soak_samples_the_loop_and_reports_its_slope(tmp_path, games_dir, capsys):
    """bench/memory_soak.py: the own-experience loop on the scripted policy runs under the sampler, every sample
    is on disk as it is taken, the loop is stopped at the deadline, and the report fits the slope."""
    from bench import memory_soak

    workdir = tmp_path / "soak"
    overrides = [
        f"envs.0.kwargs.cache_dir={games_dir}",
        "envs.0.kwargs.n_train=4",
        "envs.0.kwargs.n_eval=2",
        "lessons.gate_episodes=4",
        "lessons.extract_every=8",
    ]
    # the loop ends itself at 8 episodes (one PLAY), however slow the machine; the hours only bound it
    args = ["--hours", "0.25", "--episodes", "8", "--sample-s", "1", "--warmup-min", "0", "--workdir", str(workdir)]
    args += [x for o in overrides for x in ("--set", o)]
    assert memory_soak.main([*args, "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")]) == 0
    rows = memory_soak.read_samples(workdir / "samples.csv")
    assert len(rows) >= 5
    assert all(r["rss_kb"] > 10_000 and r["tree_kb"] >= r["rss_kb"] for r in rows)
    assert all(0 < r["anon_kb"] < r["rss_kb"] for r in rows)  # the loop's anonymous memory, a part of its VmRSS
    episodes = [r["episodes"] for r in rows]
    assert episodes == sorted(episodes) and episodes[-1] >= 8  # a batch of 8 slots played and committed
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["hours"] < 0.25  # it ended at the episodes, not at the deadline
    assert memory_soak.committed(workdir, "memory-soak-scripted") == 8
    assert result["samples"] == len(rows) and result["rss"]["mean_mib"] > 10
    assert (tmp_path / "r.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "slope %/h" in out and "| the loop, anonymous memory |" in out
    # a second call with --report reads the same samples without running anything
    assert memory_soak.main(["--report", "--workdir", str(workdir), "--warmup-min", "0"]) == 0
    assert len(memory_soak.read_samples(workdir / "samples.csv")) == len(rows)


def test_a_paused_soak_leaves_its_pauses_out_of_the_hours_and_the_slope(tmp_path):
    """Paused time (pauses.txt's wall times, mapped through clock.txt onto the soak's clock, a resumed soak's clock
    going on from its offset) is taken out: the samples taken while paused are dropped and the later ones moved
    back, so a flat stretch does not flatten a growing loop's slope."""
    from bench.memory_soak import paused_spans, report, running_time

    # started at wall 1000 (clock 0), killed, resumed at wall 9000 with its clock at 3600
    (tmp_path / "clock.txt").write_text("1000.000 0\n9000.000 3600\n")
    # paused from clock 1200 to 2400 (wall 2200-3400), and from clock 4200 on (wall 9600, not ended)
    (tmp_path / "pauses.txt").write_text("stop 2200.0\ncont 3400.0\nstop 9600.0\n")
    spans = paused_spans(tmp_path)
    assert spans == [(1200.0, 2400.0), (4200.0, float("inf"))]
    # 10 MiB an hour of running, but the samples taken while paused sit still
    rows = []
    for i in range(1, 90):
        t = 60.0 * i
        ran = t - sum(min(t, b) - a for a, b in spans if a < t)  # seconds the loop has run by then
        rows.append(
            {"seconds": t, "rss_kb": 1024 * (1000 + 10 * ran / 3600), "tree_kb": 1.0, "processes": 1, "episodes": t}
        )
    kept = running_time(rows, spans)
    assert len(kept) == len(rows) - 21 - 20  # 1200..2400 s (21 samples) and 4200 s on (20) dropped
    assert [r["seconds"] for r in kept][:21] == [60.0 * i for i in range(1, 20)] + [2460.0 - 1200, 2520.0 - 1200]
    assert report(kept, warmup_min=0)["rss"]["slope_mib_per_hour"] == pytest.approx(10.0, abs=0.01)
    assert report(rows, warmup_min=0)["rss"]["slope_mib_per_hour"] < 8.0  # the pauses left in flatten it
    assert paused_spans(tmp_path / "none") == []


def test_memory_soak_pause_stops_and_continues_the_loop_process(tmp_path):
    from bench.memory_soak import pause

    with pytest.raises(SystemExit, match="no soak has started"):
        pause(tmp_path, stop=True)
    loop = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "loop.pid").write_text(f"{loop.pid}\n")

        def state(stopped: bool) -> str:
            """The process's state letter once it is (or is not) stopped, waiting for the signal to land."""
            for _ in range(50):
                status = Path(f"/proc/{loop.pid}/status").read_text().split("\n")
                letter = next(x for x in status if x.startswith("State")).split()[1]
                if (letter == "T") == stopped:
                    break
                time.sleep(0.05)
            return letter

        assert "paused" in pause(tmp_path, stop=True)
        assert state(stopped=True) == "T"
        assert "going on" in pause(tmp_path, stop=False)
        assert state(stopped=False) != "T"
        assert (tmp_path / "pauses.txt").read_text().split()[::2] == ["stop", "cont"]
    finally:
        loop.kill()
        loop.wait()
    with pytest.raises(SystemExit, match="not running"):
        pause(tmp_path, stop=True)


@pytest.mark.slow
def test_a_soak_sent_sigterm_stops_its_loop_too(tmp_path, games_dir):
    """SIGTERM to bench/memory_soak.py (what `kill` sends) ends the loop it started as well, even a paused one,
    rather than leaving it running on its own."""
    import signal

    workdir = tmp_path / "soak"
    overrides = [f"envs.0.kwargs.cache_dir={games_dir}", "envs.0.kwargs.n_train=4", "envs.0.kwargs.n_eval=2"]
    cmd = [sys.executable, str(ROOT / "bench" / "memory_soak.py"), "--hours", "1", "--sample-s", "1"]
    cmd += ["--workdir", str(workdir), *[x for o in overrides for x in ("--set", o)]]
    soak = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if (workdir / "samples.csv").exists() and len((workdir / "samples.csv").read_text().split()) >= 2:
                break
            time.sleep(0.1)
        loop = int((workdir / "loop.pid").read_text())
        assert Path(f"/proc/{loop}").exists()
        subprocess.run(
            [sys.executable, str(ROOT / "bench" / "memory_soak.py"), "--pause", "--workdir", str(workdir)], check=True
        )
        soak.send_signal(signal.SIGTERM)
        soak.wait(timeout=300)
        for _ in range(100):  # reaped by the soak before it exits; /proc may lag a moment
            if not Path(f"/proc/{loop}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{loop}").exists(), "the loop outlived its soak"
    finally:
        if soak.poll() is None:
            soak.kill()


def test_memory_soak_slope_is_relative_to_the_mean():
    from bench.memory_soak import report, slope

    assert slope([(0, 1.0), (1, 3.0), (2, 5.0)]) == pytest.approx(2.0)
    assert slope([(0, 1.0)]) == 0.0
    # 1000 MiB growing 10 MiB an hour, sampled every 10 minutes for 3 hours, the first half hour left out
    rows = [
        {
            "seconds": 600.0 * i,
            "rss_kb": 1024 * (1000 + 10 * i / 6),
            "tree_kb": 2048 * 1000.0,
            "processes": 3,
            "episodes": 10.0 * i,
        }
        for i in range(19)
    ]
    r = report(rows, warmup_min=30)
    assert r["rss"]["slope_mib_per_hour"] == pytest.approx(10.0, abs=0.01)
    assert r["rss"]["slope_pct_per_hour"] == pytest.approx(100 * 10 / r["rss"]["mean_mib"], rel=1e-3)
    assert r["tree"]["slope_pct_per_hour"] == 0.0
    assert [h["episodes"] for h in r["hourly"]] == [60, 120, 180]


@pytest.mark.slow
def test_loop_bench_inventory_survives_a_dead_weak_proxy():
    """The memory sampler's inventory walks every live object; a weak proxy whose object is gone raised on
    isinstance and stopped the sampler thread mid-run (an own-experience run lost its inventory that way)."""
    import importlib.util
    import weakref

    import torch

    spec = importlib.util.spec_from_file_location("loop_bench", ROOT / "bench" / "loop.py")
    loop_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop_bench)

    class Holder:
        pass

    holder = Holder()
    dead = weakref.proxy(holder)
    del holder
    kept = torch.zeros(1_000_000)  # 3.8 MB, held here while the inventory runs
    out = loop_bench.holdings()
    assert dead is not None and out["other tensors"] >= kept.numel() * 4 / 2**20


@pytest.mark.slow  # loads MiniLM (~3 s)
def test_loop_bench_inventory_counts_the_embedder_apart_from_model_copies():
    import importlib.util

    from memory.embeddings import SentenceTransformerEmbedder

    spec = importlib.util.spec_from_file_location("loop_bench", ROOT / "bench" / "loop.py")
    loop_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop_bench)
    held = loop_bench.holdings()["embedder"]  # an embedder another test of this process loaded and still holds
    embedder = SentenceTransformerEmbedder()
    before = loop_bench.holdings()
    assert before["embedder"] == pytest.approx(held)  # made, not loaded yet
    embedder.embed(["take the coin"])
    after = loop_bench.holdings()
    n_bytes = sum(t.numel() * t.element_size() for t in (*embedder.module.parameters(), *embedder.module.buffers()))
    grew = after["embedder"] - held
    assert grew == pytest.approx(n_bytes / 2**20, rel=0.01) and grew > 80  # MiniLM
    assert after["model copies"] == before["model copies"]  # its embedding matrix is not a policy copy
    assert after["weights"] == pytest.approx(before["weights"], abs=1)
