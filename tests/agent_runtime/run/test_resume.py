"""Crash and stop behaviour of the loop, in real subprocesses: SIGKILL during PLAY then `--resume` loses or
duplicates no committed episode and the counters continue; SIGTERM finishes the turn, commits and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from memory import ExperienceStore


def start(workdir, games_dir, episodes, *extra):
    cmd = [
        sys.executable,
        "-m",
        "agent_runtime",
        "run",
        "configs/smoke.yaml",
        "--workdir",
        str(workdir),
        "--episodes",
        str(episodes),
        "--no-progress",
        "--set",
        f"envs.0.kwargs.cache_dir={games_dir}",
        "--set",
        "envs.0.kwargs.n_train=4",
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def committed(workdir) -> int:
    if not (workdir / "memory.db").exists():
        return 0
    try:
        with ExperienceStore.open(workdir, read_only=True) as store:
            return store.stats()["episodes"]
    except Exception:  # noqa: BLE001 -- the writer may not have created the schema yet
        return 0


def wait_for(workdir, n, proc, timeout=240):
    deadline = time.monotonic() + timeout
    while committed(workdir) < n:
        assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.2)


@pytest.mark.slow
def test_sigkill_during_play_then_resume(tmp_path, games_dir):
    workdir, total = tmp_path / "run", 150
    seen = []
    for kill_at in (20, 70):
        proc = start(workdir, games_dir, total, *(["--resume"] if seen else []))
        wait_for(workdir, kill_at, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        seen.append(committed(workdir))
    resume_to_the_end(workdir, games_dir, total)
    assert seen[0] >= 20 and seen[1] >= 70


def resume_to_the_end(workdir, games_dir, total, *extra) -> None:
    """`run --resume` to `total` episodes; then every draw is committed exactly once and the counters agree."""
    proc = start(workdir, games_dir, total, "--resume", *extra)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    with ExperienceStore.open(workdir) as store:
        [run] = store.runs()
        episodes = store.episodes(run.id, limit=10_000)
        draws = sorted(e.metadata["draw"] for e in episodes)
        assert draws == list(range(total)), "every draw exactly once: nothing lost, nothing duplicated"
        assert run.state["episodes"] == total == store.stats()["episodes"]
        assert run.state["won"] == sum(e.won for e in episodes)
        assert run.status == "finished"


@pytest.mark.slow
def test_sigterm_finishes_the_turn_commits_and_exits_0(tmp_path, games_dir):
    workdir = tmp_path / "run"
    proc = start(workdir, games_dir, 100_000)
    wait_for(workdir, 10, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "episodes" in out
    with ExperienceStore.open(workdir) as store:
        [run] = store.runs()
        assert run.status == "stopped"
        n = store.stats()["episodes"]
        assert run.state["episodes"] == n >= 10
        assert run.state["next_draw"] >= n
    in_flight = len(run.state["open_draws"])
    proc = start(workdir, games_dir, n + 5, "--resume")
    proc.communicate(timeout=300)
    with ExperienceStore.open(workdir) as store:
        [run] = store.runs()
        draws = sorted(e.metadata["draw"] for e in store.episodes(run.id, limit=10_000))
    # the draws in flight at SIGTERM are replayed first (there may be more than 5 with 8 slots), then new ones
    assert draws == list(range(len(draws))), "every draw exactly once, none skipped"
    assert len(draws) == max(n + 5, n + in_flight)


@pytest.mark.slow
def test_ray_driver_sigkill_then_resume(tmp_path, games_dir):
    """The driver of a Ray run killed with SIGKILL (its workers and local cluster go with it) resumes like the
    local loop: every draw committed exactly once."""
    ray_args = (
        "--set",
        "runtime.executor=ray",
        "--set",
        "runtime.ray.workers=2",
        "--set",
        "runtime.ray.worker_cpus=0.5",
        "--set",
        "runtime.ray.slots=2",
    )
    workdir, total = tmp_path / "run", 40
    proc = start(workdir, games_dir, total, *ray_args)
    wait_for(workdir, 12, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = committed(workdir)
    resume_to_the_end(workdir, games_dir, total, *ray_args)
    assert 12 <= killed_at < total
