"""One run per name in a store: `run` on a workdir that already holds a run of the config's name never starts a
second one beside it. A run that has not played yet (`lessons add --config` creates it) is continued, with the
lessons given to it; one that has played is refused with the exact `--resume` command, and nothing stored is lost."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from agent_runtime.config import load_config
from agent_runtime.run.loop import AgentLoop
from agent_runtime.run.names import RunExistsError
from distill.lessons import live_lessons
from memory import ExperienceStore

GOAL = "Read the goal before the first move."


def write_config(tmp_path, games_dir, **sections):
    data = {
        "name": "named",
        "model": {"name": "scripted", "backend": "scripted"},
        "envs": [
            {
                "id": "textworld/coin_collector",
                "max_steps": 4,
                "kwargs": {"level": 1, "n_train": 4, "cache_dir": str(games_dir)},
            }
        ],
        "runtime": {"slots": 2, "episodes": 2},
        "lessons": {"embedder": "hash", "gate_episodes": 0},
        **sections,
    }
    path = tmp_path / "named.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_run_after_lessons_add_continues_the_run_it_created_with_the_lesson(tmp_path, games_dir, cli):
    """The review's case: `lessons add --config` made run 1 with the lesson as a candidate the loop gates before it
    plays; a plain `run` then started run 2 of the same name, which played without the lesson, silently."""
    config = write_config(
        tmp_path,
        games_dir,
        envs=[{"id": "tests.agent_runtime.run.test_loop:LessonSensitiveEnv"}],
        lessons={"embedder": "hash", "enabled": True, "extract_every": 2, "gate_episodes": 2},
        evaluation={"episodes_per_env": 2},
    )
    workdir = tmp_path / "w"
    added = json.loads(cli("lessons", "add", GOAL, "--config", config, "--workdir", workdir, "--json").stdout)
    assert added["created_run"] is True and added["candidate"] is True
    proc = cli("run", config, "--workdir", workdir, "--no-progress", "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert f"continuing run {added['run_id']} ('named')" in proc.stderr and "has not played yet" in proc.stderr
    with ExperienceStore.open(workdir, read_only=True) as store:
        [run] = store.runs()
        assert run.id == added["run_id"] == summary["run_id"] and summary["episodes"] == 2
        assert GOAL in [x.text for x in live_lessons(store, run.id)[1]], "the gate let the lesson in"
        assert all(e.lessons_in_context for e in store.episodes(run.id)), "the run played with it"


def test_run_refuses_a_second_run_of_a_name_that_has_played_and_names_the_resume_command(tmp_path, games_dir, cli):
    config, workdir = write_config(tmp_path, games_dir), tmp_path / "w"
    cli("run", config, "--workdir", workdir, "--no-progress")
    again = cli("run", config, "--workdir", workdir, "--episodes", 4, "--no-progress", check=False)
    command = f"agent-runtime run {config} --workdir {workdir} --episodes 4 --resume"
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert "run 1 ('named')" in again.stderr and "has played 2 episodes" in again.stderr
    assert command in again.stderr
    with ExperienceStore.open(workdir, read_only=True) as store:
        [run] = store.runs()
        assert store.stats()["episodes"] == run.state["episodes"] == 2, "nothing stored is lost or added"
    dry = cli("run", config, "--workdir", workdir, "--dry-run", check=False)
    assert dry.returncode == 2 and "run 1 ('named') has played 2 episodes" in dry.stdout
    assert "--resume continues it" in dry.stdout
    resumed = cli(*shlex.split(command)[1:], "--no-progress", "--json")
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["episodes"] == 4
    with ExperienceStore.open(workdir, read_only=True) as store:
        assert [r.id for r in store.runs()] == [1] and store.stats()["episodes"] == 4


def test_the_python_api_starts_no_twin_either(tmp_path, games_dir):
    config = load_config(write_config(tmp_path, games_dir))
    loop = AgentLoop(config, tmp_path / "w", progress=False)
    loop.run()
    loop.close()
    with pytest.raises(RunExistsError, match=r"run 1 \('named'\) in .* has played 2 episodes.*--resume"):
        AgentLoop(config, tmp_path / "w", progress=False)
    with ExperienceStore.open(tmp_path / "w", read_only=True) as store:
        assert len(store.runs()) == 1
