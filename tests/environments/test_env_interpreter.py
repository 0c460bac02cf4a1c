"""Interpreter meta-commands never reach a game, and a game never writes into the runtime's directory.

The exploit these tests reproduce: `save` one step before the end of a coin-collector game, then in a
later episode of the same task `restore` and take the coin: a win in two steps. Meta-commands are
answered like any unknown verb (no reward, no state change, one step of the budget), and the
interpreter runs in its own process whose working directory is private, emptied at every reset and
removed on close.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

import environments
from environments.interpreter import UNKNOWN_VERB, meta_command
from tests import TESTS, stop_process

LEVEL = 3

# commands addressed to the interpreter, not the story; ALFWorld's test plays them too
META = json.loads((TESTS / "data" / "meta_commands.json").read_text())


@pytest.fixture
def private_cwd(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def _coin(games_dir):
    return environments.make("textworld/coin_collector", level=LEVEL, cache_dir=str(games_dir))


@pytest.mark.slow
def test_a_saved_game_cannot_be_restored_in_a_later_episode(games_dir, private_cwd):
    env = _coin(games_dir)
    env.reset(task_id="train-0")
    walkthrough = env.expert_actions()
    for action in walkthrough[:-1]:
        env.step(action)
    env.step("save")
    env.step("script")
    for later in (env, _coin(games_dir)):  # the same instance, and a fresh one as another worker would make
        later.reset(task_id="train-0")
        restored = later.step("restore")
        result = later.step(walkthrough[-1])
        assert restored.reward == 0.0 and result.reward == 0.0
        assert not result.terminated and not result.info["won"]
        later.close()
    assert sorted(os.listdir(private_cwd)) == []


@pytest.mark.parametrize("command", META)
def test_meta_commands_are_invalid_actions(command, games_dir, private_cwd):
    env = _coin(games_dir)
    _, before = env.reset(task_id="train-0")
    result = env.step(command)
    assert result.observation == UNKNOWN_VERB
    assert result.reward == 0.0 and not result.terminated and not result.truncated
    assert result.info["score"] == before["score"] and result.info["admissible_actions"] == before["admissible_actions"]
    assert result.info["meta_command"]
    env.close()
    assert os.listdir(private_cwd) == []


def test_meta_commands_change_nothing_and_use_the_step_budget(games_dir, private_cwd):
    env = _coin(games_dir)
    env.reset(task_id="train-0")
    walkthrough = env.expert_actions()
    half = len(walkthrough) // 2
    for action in walkthrough[:half]:
        env.step(action)
    for command in ("restart", "yes", "verbose", "superbrief", "undo", "restore"):
        env.step(command)
    for action in walkthrough[half:]:
        result = env.step(action)
    assert result.terminated and result.info["won"] and result.reward == 1.0
    short = environments.make("textworld/coin_collector", level=LEVEL, cache_dir=str(games_dir), max_steps=3)
    short.reset(task_id="train-0")
    assert [short.step("save").truncated for _ in range(3)] == [False, False, True]
    env.close()
    short.close()
    assert os.listdir(private_cwd) == []


@pytest.mark.slow
def test_real_game_commands_are_not_meta(games_dir):
    """No false positives: every admissible action and walkthrough step of sampled games passes."""
    for env_id, kwargs in (
        ("textworld/coin_collector", {"level": LEVEL}),
        ("textworld/cooking", {"recipe": 1, "take": 1, "go": 1}),
    ):
        env = environments.make(env_id, **kwargs, cache_dir=str(games_dir))
        for task in ("train-0", "eval-0"):
            _, info = env.reset(task_id=task)
            commands = info["admissible_actions"] + env.expert_actions()
            assert [c for c in commands if meta_command(c)] == []
        env.close()
    for command in (
        "take the coin",
        "go east",
        "look",
        "inventory",
        "goal",
        "help",
        "examine long sword",
        "take scoreboard",
        "open restored chest",
        "put saved apple on table",
    ):
        assert meta_command(command) is None, command


def test_the_interpreter_writes_only_into_its_own_directory(games_dir, private_cwd):
    """Defence in depth: even a file-writing command sent straight to the interpreter stays private."""
    env = _coin(games_dir)
    env.reset(task_id="train-0")
    game = env.interpreter
    game.step("save")
    workdir = game.workdir
    assert os.listdir(workdir) and os.listdir(private_cwd) == []
    env.reset(task_id="train-0")
    assert os.listdir(workdir) == []
    assert "Ok." not in game.step("restore")[0]["feedback"]
    env.close()
    assert not workdir.exists() and os.listdir(private_cwd) == []


def test_a_hung_or_dead_interpreter_is_an_env_error_and_reset_recovers(games_dir, monkeypatch):
    from environments.interpreter import InterpreterProcess

    env = _coin(games_dir)
    env.reset(task_id="train-0")
    first = env.expert_actions()[0]
    monkeypatch.setattr(InterpreterProcess, "STEP_TIMEOUT_S", 1.0)
    stop_process(env.interpreter.pid)
    with pytest.raises(environments.EnvError, match="no answer to step 'go west' within 1 s and was killed"):
        env.step("go west")
    env.reset(task_id="train-0")
    os.kill(env.interpreter.pid, signal.SIGKILL)
    with pytest.raises(environments.EnvError, match="exited during step"):
        env.step(first)
    env.reset(task_id="train-0")
    assert env.step(first).observation and env.interpreter.alive
    env.close()
    assert env.interpreter is None


def test_a_game_process_whose_runtime_went_away_mid_request_ends_quietly():
    """The runtime killed with a request in flight: the answer cannot be sent (a broken or reset connection, not
    an end of file). The game process must end as when it reads an end of file (False: not closed by its
    runtime), so that it goes on to remove its folder; it raised instead, and 40 folders were left by a soak."""
    import multiprocessing

    from environments.interpreter import _play

    ours, theirs = multiprocessing.Pipe()
    ours.send_bytes(json.dumps({"op": "step", "command": "look"}).encode())
    ours.close()
    assert _play(theirs) is False
    ours, theirs = multiprocessing.Pipe()
    ours.send_bytes(json.dumps({"op": "close"}).encode())
    assert _play(theirs) is True
