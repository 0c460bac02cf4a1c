"""alfworld/text: offline-generated games checked by alfworld's expert, and the official-data layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import environments
from environments.alfworld.generate import TASK_TYPES, generate_game, mangle
from tests import ROOT, TESTS


@pytest.fixture(scope="module")
def simple_env(games_dir):
    return environments.make("alfworld/text", cache_dir=str(games_dir), task_types=["pick_and_place_simple"])


def _play(env, task_id):
    _, info = env.reset(task_id=task_id)
    result = None
    for action in env.expert_actions():
        assert action in info["admissible_actions"], action
        result = env.step(action)
        info = result.info
    return result


@pytest.mark.slow
def test_generated_games_say_so_and_the_expert_wins(simple_env):
    assert simple_env.spec.kwargs["source"] == "generated"
    assert "not comparable" in simple_env.spec.description
    for task in ("train-0", "eval-0"):
        observation, info = simple_env.reset(task_id=task)
        assert observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
        assert info["goal"] and info["goal"] in observation and info["source"] == "generated"
        result = _play(simple_env, task)
        assert result.terminated and result.info["won"] and result.reward == 1.0


def test_train_and_eval_use_different_rooms(simple_env):
    train_dir, eval_dir = simple_env.game_dir("train-0"), simple_env.game_dir("eval-0")
    train_scene = json.loads((train_dir / "traj_data.json").read_text())["scene"]["floor_plan"]
    eval_scene = json.loads((eval_dir / "traj_data.json").read_text())["scene"]["floor_plan"]
    from alfworld.gen import constants

    assert int(train_scene.removeprefix("FloorPlan")) in constants.TRAIN_SCENE_NUMBERS
    assert int(eval_scene.removeprefix("FloorPlan")) in constants.TEST_SCENE_NUMBERS


def test_sink_reads_sinkbasin():
    game = next(g for seed in range(50) if (g := generate_game(seed, "pick_clean_then_place_in_recep", 6)) is not None)
    problem = game.game_data["pddl_problem"]
    assert mangle("Sink|") in problem and "SinkBasin_bar_" not in problem


def test_invalid_action_is_answered_by_the_game(simple_env):
    simple_env.reset(task_id="train-0")
    result = simple_env.step("fly to the moon")
    assert not result.terminated and result.reward == 0.0 and result.observation


@pytest.mark.slow
def test_every_task_type_is_solved_by_the_expert(games_dir):
    env = environments.make("alfworld/text", cache_dir=str(games_dir))
    for index, task_type in enumerate(TASK_TYPES):
        observation, info = env.reset(task_id=f"train-{index}")
        assert "basinbasin" not in observation  # the demangler pitfall: sinks read "sinkbasin 1"
        if task_type == "pick_clean_then_place_in_recep":
            assert "sinkbasin 1" in observation or "bathtubbasin 1" in observation
        result = _play(env, f"train-{index}")
        assert result.info["won"], (task_type, info["goal"])


def test_official_data_layout_is_read(simple_env, tmp_path):
    """A data folder in alfworld's layout switches the env to official games and their splits."""
    source = simple_env.game_dir("train-0")
    folders = (
        ("train", "pick_and_place_simple-A"),
        ("valid_seen", "pick_and_place_simple-C"),
        ("valid_unseen", "pick_and_place_simple-B"),
    )
    for split, name in folders:
        target = tmp_path / "json_2.1.1" / split / name / "trial_1"
        target.mkdir(parents=True)
        for file in ("game.tw-pddl", "traj_data.json"):
            shutil.copy(source / file, target / file)
    env = environments.make("alfworld/text", data_path=str(tmp_path), task_types=["pick_and_place_simple"])
    assert env.spec.kwargs["source"] == "official"
    assert list(env.tasks("train")) == ["json_2.1.1/train/pick_and_place_simple-A/trial_1"]
    assert list(env.tasks("eval")) == ["json_2.1.1/valid_unseen/pick_and_place_simple-B/trial_1"]
    assert list(env.tasks("validation")) == ["json_2.1.1/valid_seen/pick_and_place_simple-C/trial_1"]
    seen_rooms = environments.make(
        "alfworld/text", data_path=str(tmp_path), task_types=["pick_and_place_simple"], eval_split="valid_seen"
    )
    assert list(seen_rooms.tasks("validation")) == ["json_2.1.1/valid_unseen/pick_and_place_simple-B/trial_1"]
    result = _play(env, env.tasks("eval")[0])
    assert result.info["won"] and result.info["source"] == "official"
    with pytest.raises(environments.EnvError, match="no solvable train games"):
        environments.make("alfworld/text", data_path=str(tmp_path), task_types=["pick_two_obj_and_place"])


def test_generation_is_deterministic_across_processes():
    """Same seed, task type and room give the same game whatever the interpreter's hash seed."""
    script = (
        "import hashlib\n"
        "from environments.alfworld.generate import generate_game\n"
        "g = generate_game(7, 'pick_two_obj_and_place', 6)\n"
        "print(hashlib.sha256((g.game_data['pddl_problem'] + g.game_data['grammar']).encode()).hexdigest())"
    )
    repo = str(ROOT)
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": repo},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert len(digests) == 1 and len(digests.pop()) == 64


def test_interpreter_meta_commands_change_nothing(simple_env, tmp_path, monkeypatch):
    """ALFWorld's PDDL engine applies only admissible commands; meta-commands are flagged like TextWorld's,
    answered with its usual "Nothing happens.", and neither change the game nor write files."""
    meta = json.loads((TESTS / "data" / "meta_commands.json").read_text())
    monkeypatch.chdir(tmp_path)
    _, before = simple_env.reset(task_id="train-0")
    for command in meta:
        result = simple_env.step(command)
        assert result.observation == "Nothing happens." and result.reward == 0.0 and not result.terminated
        assert result.info["admissible_actions"] == before["admissible_actions"]
        assert result.info["meta_command"], command
    simple_env.reset(task_id="train-0")
    for action in simple_env.expert_actions():
        assert simple_env.step(action).info.get("meta_command") is None
    assert list(tmp_path.iterdir()) == []


def test_lines_with_several_objects_or_commands_change_nothing(simple_env):
    """As in TextWorld: never sent to the engine, flagged, the game unchanged; the expert still
    wins."""
    _, before = simple_env.reset(task_id="train-0")
    first = simple_env.expert_actions()[0]
    for line in (
        "take all.",
        "TAKE ALL",
        "get everything.",
        f"{first}. {first}",
        f"{first} then look",
        "take all except knife 1",
        "take apple 1 and knife 1",
    ):
        result = simple_env.step(line)
        assert result.observation == "Nothing happens." and result.reward == 0.0 and not result.terminated, line
        assert result.info["multi_command"] and result.info["admissible_actions"] == before["admissible_actions"]
    assert _play(simple_env, "train-0").info["won"]
