"""Crash safety: a writer SIGKILLed at random moments never leaves a partial episode or a broken file,
and readers keep working while the writer writes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from memory import ExperienceStore
from memory.models import Episode, Step
from tests import ROOT

REPO = ROOT
KILLS = int(os.environ.get("AGENT_RUNTIME_CRASH_KILLS", "12"))

WRITER = r"""
import sys
from memory import ExperienceStore
from memory.testing import make_episode

store = ExperienceStore.open(sys.argv[1], index_dir=sys.argv[2], embedder="hash:64")
run = store.find_run("crash") or store.get_run(store.create_run("crash", {}))
done = run.state.get("episodes", 0)
print("ready", flush=True)
while True:
    record = make_episode(20, task_id=f"t{done}")
    for step in record.steps:
        step.prompt = step.prompt * 40  # ~1.5 KB per step, so WAL checkpoints happen too
    done += 1
    episode_id = store.add_episode(run.id, record, run_state={"episodes": done})
    print(episode_id, flush=True)
    if done % 7 == 0:
        store.record_extraction("m", [f"lesson {done}"], run_id=run.id, episode_ids=[episode_id])
"""


def _check_consistent(target: str, index_dir: Path, committed: set[int]) -> int:
    with ExperienceStore.open(target, index_dir=index_dir, embedder="hash:64") as store:
        with store._read() as session:
            steps = dict(session.execute(select(Step.episode_id, func.count(Step.id)).group_by(Step.episode_id)).all())
            declared = dict(session.execute(select(Episode.id, Episode.num_steps)).all())
        assert all(steps.get(i, 0) == n == 20 for i, n in declared.items()), "partial episode"
        assert committed <= set(declared), f"lost committed episodes {committed - set(declared)}"
        run = store.find_run("crash")
        assert run is not None and run.state["episodes"] == len(declared)
        return len(declared)


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_committed(memory_url: str, tmp_path: Path) -> None:
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    committed: set[int] = set()
    index_dir = tmp_path / "index"
    for attempt in range(KILLS):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, memory_url, str(index_dir)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read() if writer.stderr else ""
        os.set_blocking(writer.stdout.fileno(), False)
        time.sleep(rng.uniform(0.0, 0.4))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        os.set_blocking(writer.stdout.fileno(), True)
        committed |= {int(line) for line in writer.stdout.read().split()}
        total = _check_consistent(memory_url, index_dir, committed)
    assert total >= len(committed) > KILLS  # it really wrote between kills


@pytest.mark.slow
def test_readers_work_while_a_writer_writes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    target = str(tmp_path / "work")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, target, str(tmp_path / "index")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        seen = []
        with ExperienceStore.open(target, read_only=True) as reader:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                stats = reader.stats()
                assert stats["steps"] == 20 * stats["episodes"]
                if stats["episodes"]:
                    newest = reader.episodes(limit=1)[0]
                    assert len(reader.episode(newest.id).steps) == 20
                seen.append(stats["episodes"])
        assert writer.poll() is None, "the writer must still be running"
        assert seen[-1] > seen[0] and len(seen) > 10  # readers saw progress, without blocking
    finally:
        writer.kill()
        writer.wait()
