"""The soak (bench/soak.py) in short, its invariant checks, and what the soak found.

- A short soak: the loop on the tiny model with real EXTRACT and OPCD cycles, killed with SIGKILL 6 times at
  random moments and resumed, then run on: nothing lost or duplicated, no phase done twice, lessons within the
  budget, nothing of a killed session left running.
- The checks themselves catch what they are for (a duplicated, a lost and a miscounted draw; an EXTRACT done
  twice; a pool over its budget), so a clean soak means something.
- Found by the soak: a second store opened in a process took the first one's SQLite locks away (the header
  check closed a descriptor of its own on the file), so another process's last close deleted the WAL under
  the first store, whose reads then missed a running writer's commits (or failed as "malformed"). Fixed.
- Found by the soak and fixed: every EXTRACT measured and stored the utility of every lesson the run ever
  had (retired ones included), so its time grew with the run and the stored snapshots quadratically (now: the
  lessons that can still enter a context, and only the newest snapshot is read); a game process outlived a
  SIGKILLed runtime cleanly but left its private folder behind (now it removes it when its runtime is gone).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import soak
from bench.soak_checks import budget_violations, draw_violations, phase_violations
from memory import ExperienceStore
from memory.testing import make_episode
from tests import ROOT


def _episode(draw: int, *, won: bool = False):
    record = make_episode(1, outcome="won" if won else "truncated")
    record.won = won
    record.metadata = {"draw": draw}
    record.ended_at = dt.datetime.now(dt.UTC)  # phases are placed by when episodes ended
    return record


@pytest.mark.slow
def test_a_short_soak_loses_nothing_and_does_no_phase_twice(tmp_path, games_dir):
    settings = soak.Settings(
        workdir=tmp_path / "soak",
        model_dir=tmp_path / "tiny",
        games_dir=games_dir,
        kills=6,
        run_on=90,
        seed=3,
        extract_every=40,
        consolidate_every=80,
        cycle_steps=2,
        train_tasks=4,
        min_delay=6.0,
        max_delay=14.0,
        phase_kills=0.3,
        phase_grace=3.0,
        final_timeout=300,
    )
    soak.prepare(settings)  # the soak's own tiny model, whose choices lessons change
    report = soak.Soak(settings).run()
    assert report["violations"] == []
    assert report["kills"] == 6 and report["survivors"] == 0
    assert report["game_dirs_left"] == 0, "a killed session's game processes remove their folders"
    assert report["extractions"] >= 2 and sum(report["cycles"].values()) >= 1
    print(soak.table(report))
    with ExperienceStore.open(settings.workdir, read_only=True) as store:  # the harness's word not taken
        [run] = store.runs()
        draws = sorted(e.metadata["draw"] for e in store.episodes(run.id, limit=10_000))
        assert draws == list(range(report["episodes"])) and run.state["episodes"] == len(draws)
        assert run.status == "finished" and not store.cycles(run.id, status="running")


def test_the_draw_check_finds_a_duplicated_a_lost_and_a_miscounted_draw(tmp_path):
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("r", {})
        for draw in (0, 1, 3):
            store.add_episode(run_id, _episode(draw, won=draw == 3))
        store.update_run(run_id, state={"episodes": 3, "won": 1, "errors": 0, "next_draw": 5, "open_draws": [2, 4]})
        assert draw_violations(store, store.get_run(run_id)) == []
        store.add_episode(run_id, _episode(1))
        store.update_run(run_id, state={"episodes": 3, "won": 1, "errors": 0, "next_draw": 5, "open_draws": [4]})
        found = draw_violations(store, store.get_run(run_id))
    assert any("more than once: [1]" in v for v in found)
    assert any("lost (neither committed nor open): [2]" in v for v in found)
    assert any("state.episodes = 3 but the rows say 4" in v for v in found)


def test_the_phase_check_finds_an_extract_done_twice(tmp_path):
    config = {"lessons": {"extract_every": 4, "recent_episodes": 2, "pools": 1}, "opcd": {"consolidate_every": 100}}
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("r", {})
        ids = []
        for phase in range(2):
            ids += [store.add_episode(run_id, _episode(d)) for d in range(4 * phase, 4 * phase + 4)]
            for episode_id in ids[-2:]:  # one EXTRACT: the 2 newest episodes, once each (one pool)
                store.record_extraction("x", [], run_id=run_id, episode_ids=[episode_id])
        store.update_run(run_id, state={"episodes": 8, "extractions": 2, "cycles": 0})
        assert phase_violations(store, store.get_run(run_id), config) == []
        for episode_id in ids[-2:]:  # the second EXTRACT again, as a resume that redid it would
            store.record_extraction("x", [], run_id=run_id, episode_ids=[episode_id])
        found = phase_violations(store, store.get_run(run_id), config)
    assert any("other than 2 extractions" in v and "8: 4" in v for v in found), found


def test_the_budget_check_finds_a_pool_over_its_budget(tmp_path):
    def words(text: str) -> int:
        return len(text.split())

    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("r", {})
        _, small = store.record_extraction("x", ["take the coin first"], run_id=run_id, pool=0)
        _, large = store.record_extraction("x", ["look around " * 20], run_id=run_id, pool=1)
        store.create_lesson_set(run_id, small + large)
        found = budget_violations(store, run_id, words, budget=20)
    assert found and all("pool 1" in v for v in found)


def test_the_soak_extractor_writes_items_that_follow_the_trajectory():
    from langchain_core.messages import HumanMessage

    writer = soak.SoakLessonWriter()
    first = writer.invoke([HumanMessage(content="trajectory A")]).content
    assert first == writer.invoke([HumanMessage(content="trajectory A")]).content  # a re-run writes the same
    assert first != writer.invoke([HumanMessage(content="trajectory B")]).content
    assert all(line.startswith("- EXPERIENCE ITEM: ") for line in first.splitlines())


_WRITER = """
import sys
from memory import ExperienceStore
from memory.testing import make_episode
store = ExperienceStore.open(sys.argv[1])
[run] = store.runs()
store.add_episode(run.id, make_episode())
print("written", flush=True)
if sys.argv[2] == "stay":
    sys.stdin.read()
store.close()
"""


def _write_elsewhere(workdir: Path, stay: bool) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(workdir), "stay" if stay else "close"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "written\n"
    return proc


@pytest.mark.slow
def test_a_second_store_in_a_process_leaves_the_first_one_seeing_a_live_writer(tmp_path):
    """The dashboard opens a second store for search; the soak's harness opens one per check. Either took the
    first store's SHARED lock away, and the next process to close its last connection deleted the WAL under
    it: the first store then missed the commits of the loop writing in another process."""
    with ExperienceStore.open(tmp_path) as store:
        store.add_episode(store.create_run("r", {}), make_episode())
    reader = ExperienceStore.open(tmp_path, read_only=True)
    try:
        assert reader.count_episodes() == 1  # its pooled connection holds SQLite's SHARED lock from here on
        ExperienceStore.open(tmp_path, read_only=True).close()
        _write_elsewhere(tmp_path, stay=False).wait()  # its last close checkpoints (and deletes the WAL if it can)
        loop = _write_elsewhere(tmp_path, stay=True)  # a writer still running, its commit in the WAL
        try:
            assert reader.count_episodes() == 3
        finally:
            loop.stdin.close()
            loop.wait()
    finally:
        reader.close()


def test_an_extract_measures_the_utility_of_the_lessons_that_can_still_enter_a_context(tmp_path):
    """In the soak, 866 of 884 lessons were retired at the end; each EXTRACT still measured all of them over the
    newest 5000 episodes (2.1 s of its 2.9 s) and stored the whole snapshot (153 KB by then, 5.7 MB in all, a
    fifth of the store), and `load_utilities` read every snapshot back to use the newest."""
    from distill.lessons.gate import measure_utilities

    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("r", {})
        _, ids = store.record_extraction(
            "x", [f"lesson {i}: take the coin in room {i}" for i in range(50)], run_id=run_id
        )
        store.set_lesson_status(ids[:-2], "retired")
        store.set_lesson_status(ids[-2:], "active")
        assert set(measure_utilities(store, run_id)) == set(ids[-2:])


_GAME = """
import sys
import environments
env = environments.make("textworld/coin_collector", level=1, n_train=1, n_eval=1, cache_dir=sys.argv[1])
env.reset(task_id=env.tasks("train")[0])
print("playing", flush=True)
sys.stdin.read()
"""


def test_a_sigkilled_runtime_leaves_no_game_folder_behind(tmp_path, games_dir):
    """268 folders (agent-runtime-game-*, with cwd/ and interpreter.log) were left by the soak's 100 kills."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", _GAME, str(games_dir)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert proc.stdout.readline() == "playing\n"
    assert list(tmp.glob("agent-runtime-game-*"))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while list(tmp.glob("agent-runtime-game-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(tmp.glob("agent-runtime-game-*"))
