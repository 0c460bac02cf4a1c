"""Every built-in environment: check_env conformance, determinism, splits, experts that win, bad input.

TextWorld games are tiny (short quests) and cached once per session in `games_dir`; the dataset-backed
math sets read a small local JSONL so that no test needs the network.
"""

from __future__ import annotations

import json

import pytest

import environments
from environments.checker import env_failures

TEXTWORLD = {
    "textworld/coin_collector": {"level": 2},
    "textworld/treasure_hunter": {"level": 1},
    "textworld/cooking": {"recipe": 1, "take": 1, "go": 1},
    "textworld/simple": {},
    "textworld/custom": {"nb_rooms": 2, "nb_objects": 3, "quest_length": 2},
}
ARENA = {"textarena/frozenlake": {}, "textarena/sokoban": {}}


@pytest.fixture(scope="session")
def problems_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("math") / "problems.jsonl"
    rows = [{"question": f"What is {n} times 3?", "answer": f"{n} * 3 = {3 * n}\n#### {3 * n}"} for n in range(1, 21)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


@pytest.fixture(scope="session")
def choice_files(tmp_path_factory):
    """Small local files for the question sets (qa/*), in the layout of the OPCD paper's exports."""
    folder = tmp_path_factory.mktemp("qa")
    rows = {
        "qa/medmcqa": [{"content": f"Question {n}? A. a B. b C. c D. d", "answer": "ABCD"[n % 4]} for n in range(20)],
        "qa/safety": [{"content": f"Statement {n}: harmful?", "answer": ("yes", "no")[n % 2]} for n in range(20)],
    }
    paths = {}
    for env_id, lines in rows.items():
        paths[env_id] = folder / f"{env_id.split('/')[1]}.jsonl"
        paths[env_id].write_text("\n".join(json.dumps(r) for r in lines))
    return {env_id: str(path) for env_id, path in paths.items()}


def _kwargs(env_id: str, games_dir, problems_file, choice_files=None) -> dict:
    if choice_files and env_id in choice_files:
        return {"path": choice_files[env_id]}
    if env_id in TEXTWORLD:
        return {**TEXTWORLD[env_id], "cache_dir": str(games_dir)}
    if env_id in ("math/gsm8k", "math/math", "math/dapo"):
        return {"path": problems_file}
    if env_id == "alfworld/text":
        return {"cache_dir": str(games_dir), "task_types": ["pick_and_place_simple"]}
    return {}


# the games on the JVM (twx/*, tales/*: TWX games with TALES' parameters, scienceworld/*) are checked in
# tests/environments/test_env_java_games.py: every TWX game, and ScienceWorld through representative tasks (its 30 share
# one adapter; a check costs 30-60 s of JVM time each)
BUILTIN_IDS = sorted(
    r.id
    for r in environments.list_envs()
    if r.source == "builtin" and not r.id.startswith(("twx/", "tales/", "scienceworld/"))
)


SLOW_CHECKS = {"alfworld/text", "textworld/simple"}  # over ~5 s each (a generated ALFWorld game, a longer quest)


@pytest.mark.parametrize(
    "env_id", [pytest.param(e, marks=pytest.mark.slow) if e in SLOW_CHECKS else e for e in BUILTIN_IDS]
)
def test_check_env_passes(env_id, games_dir, problems_file, choice_files):
    env = environments.make(env_id, **_kwargs(env_id, games_dir, problems_file, choice_files))
    assert env_failures(env) == []
    assert env.spec.id == env_id
    assert env.spec.family == env_id.split("/")[0].replace("textworld", "text").replace("alfworld", "text").replace(
        "textarena", "arena"
    ).replace("qa", "math")  # the question sets answer in one free reply


@pytest.mark.parametrize("env_id", sorted(TEXTWORLD) + sorted(ARENA))
def test_expert_wins_sampled_tasks(env_id, games_dir, problems_file):
    env = environments.make(env_id, **_kwargs(env_id, games_dir, problems_file))
    for task in [env.tasks("train")[0], env.tasks("eval")[0]]:
        _, info = env.reset(task_id=task)
        total, result = 0.0, None
        for action in env.expert_actions():
            if "admissible_actions" in info:
                assert action in info["admissible_actions"], (task, action)
            result = env.step(action)
            total += result.reward
            info = result.info
        assert result is not None and result.terminated and result.info["won"] is True, task
        assert total > 0
    env.close()


@pytest.mark.parametrize("env_id", ["textworld/coin_collector", "textarena/sokoban", "math/gsm_symbolic"])
def test_same_task_same_game_across_instances(env_id, games_dir, problems_file):
    kwargs = _kwargs(env_id, games_dir, problems_file)
    first, second = environments.make(env_id, **kwargs), environments.make(env_id, **kwargs)
    task = first.tasks("eval")[1]
    assert first.reset(task_id=task) == second.reset(task_id=task)
    assert first.reset(seed=7)[0] == second.reset(seed=7)[0]
    assert first.reset(task_id=first.tasks("train")[0])[0] != first.reset(task_id=first.tasks("train")[1])[0]


def test_textworld_games_are_cached_by_parameters(games_dir):
    env = environments.make("textworld/coin_collector", level=2, cache_dir=str(games_dir))
    path = env.game_file("train-0")
    mtime = path.stat().st_mtime_ns
    again = environments.make("textworld/coin_collector", level=2, cache_dir=str(games_dir))
    assert again.game_file("train-0") == path and path.stat().st_mtime_ns == mtime
    other = environments.make("textworld/coin_collector", level=3, cache_dir=str(games_dir))
    assert other.game_key("train-0") != env.game_key("train-0")
    assert env.game_key("train-0") != env.game_key("eval-0")


def test_textworld_rewards_are_score_differences(games_dir):
    env = environments.make("textworld/cooking", **TEXTWORLD["textworld/cooking"], cache_dir=str(games_dir))
    _, info = env.reset(task_id="train-0")
    assert info["score"] == 0 and info["goal"] and info["admissible_actions"]
    total = 0.0
    for action in env.expert_actions():
        result = env.step(action)
        total += result.reward
    assert total == result.info["score"] == result.info["max_score"] > 1  # several scored steps


def test_invalid_actions_get_the_games_feedback(games_dir):
    env = environments.make("textworld/coin_collector", level=2, cache_dir=str(games_dir))
    env.reset(task_id="train-0")
    result = env.step("dance wildly")
    assert not result.terminated and result.reward == 0 and result.observation
    arena = environments.make("textarena/frozenlake")
    arena.reset(task_id="train-0")
    result = arena.step("I would rather not move")
    assert "invalid" in result.observation.lower() and result.reward == 0.0


def test_arena_uses_last_bracketed_move():
    env = environments.make("textarena/frozenlake")
    env.reset(task_id="train-3")
    first = env.expert_actions()[0]
    wrong = "[up]" if first != "[up]" else "[left]"
    result = env.step(f"Maybe {wrong}? No: {first.replace('[', '[ ')}")
    assert "invalid" not in result.observation.lower() and "moved" in result.observation
    assert "Grid symbols" not in result.observation and "Welcome" not in env.reset(task_id="train-3")[0]


def test_arena_truncates_after_five_turns():
    env = environments.make("textarena/sokoban")
    env.reset(task_id="eval-2")
    results = [env.step("[left]" if i % 2 else "[right]") for i in range(5)]
    last = results[-1]
    assert all(not r.truncated for r in results[:-1])
    assert last.terminated or last.truncated
    assert last.reward == (1.0 if last.info["won"] else 0.0)


def test_math_episode_is_one_step(problems_file):
    env = environments.make("math/gsm8k", path=problems_file)
    question, info = env.reset(task_id="train-0")
    assert question == "What is 1 times 3?" and "gold" not in info
    result = env.step("3 times 1 is 3, so \\boxed{3}")
    assert result == (result.observation, 1.0, True, False, result.info) and result.info["gold"].endswith("#### 3")
    env.reset(task_id="train-0")
    assert env.step("\\boxed{4}").reward == 0.0
    assert (len(env.tasks("train")), len(env.tasks("validation")), len(env.tasks("eval"))) == (17, 1, 2)


def test_math_datasets_without_data_say_how_to_fix():
    with pytest.raises(environments.EnvError, match="path=/local/file.jsonl"):
        environments.make("math/math")


def test_gsm_symbolic_gives_fresh_verified_variants():
    env = environments.make("math/gsm_symbolic")
    train, evals = env.tasks("train"), env.tasks("eval")
    templates = lambda ids: {t.split("-")[0] for t in ids}
    assert not templates(train[:200]) & templates(evals[:200])
    seen = set()
    for task in train[:6]:
        question, _ = env.reset(task_id=task)
        seen.add(question)
        assert env.step(env.expert_actions()[0]).reward == 1.0
    assert len(seen) == 6
    assert env.reset(task_id="1-0")[0] != env.reset(task_id="1-1")[0]


def test_unknown_task_id_is_a_clear_error(games_dir):
    env = environments.make("textarena/frozenlake")
    with pytest.raises(environments.UnknownTaskError, match="task ids look like 'train-0'"):
        env.reset(task_id="level-9")


def test_gsm_symbolic_seeds_never_wrap():
    env = environments.make("math/gsm_symbolic", n_train=10)
    # every fifth template is held out for eval, every tenth from the third for validation
    train_templates = [t for t in range(100) if t % 5 and t % 10 != 2]
    assert env.reset(seed=5)[0] != env.reset(seed=15)[0]
    assert env.task_id == f"{train_templates[15]}-0"
    env.reset(seed=70 * 7 + 3)
    assert env.task_id == f"{train_templates[3]}-7"


@pytest.mark.slow
def test_textworld_survives_interpreter_hostile_commands(tmp_path):
    """NUL bytes hang frotz, backslash commands make it loop forever, some long non-ASCII input crashed it:
    each gets the game's own feedback instead."""
    import environments

    env = environments.make("textworld/coin_collector", cache_dir=str(tmp_path), level=1, n_train=2)
    env.reset(task_id=env.tasks("train")[0])
    for action in ("\x00go north", "\\oin pastdownouth", "\\\\", "é\x19take " * 60, "go north " * 80):
        result = env.step(action)
        assert isinstance(result.observation, str) and result.observation
    env.close()
