"""A decision's fold: refused when it shares a game with the train or the held-out fold (by task id or by an opening
that identifies a game), warned when it holds fewer games than the decisions ask for; what each decision can see is
printed at the run's start."""

from __future__ import annotations

import logging

import pytest

from agent_runtime.config import ConfigError, config_from_dict
from agent_runtime.evaluation.heldout import FoldOverlapError, check_folds, decision_folds
from agent_runtime.phases.promotion import decision_sights
from agent_runtime.run.loop import AgentLoop
from tests.folds_envs import EVAL_IDS, SAME_GAMES, SHORT


def _config(env_id: str, **opcd) -> dict:
    return {
        "name": "folds",
        "envs": [{"id": env_id}],
        "model": {"name": "scripted", "backend": "scripted"},
        "runtime": {"slots": 2, "episodes": 2},
        "memory": {"embedder": "hash"},
        "evaluation": {"episodes_per_env": 4},
        "lessons": {"enabled": True, "gate_episodes": 4, "extract_every": 1000},
        "opcd": opcd,
    }


def test_the_folds_each_decision_reads() -> None:
    config = config_from_dict(_config(SHORT, enabled=True, validation_games=6, recheck_games=2))
    assert decision_folds(config) == {"validation": 8, "train": 4}  # the promotion and its recheck; the trials


@pytest.mark.parametrize(
    "env_id, says",
    [(EVAL_IDS, "holds train or held-out tasks ['eval-0'"), (SAME_GAMES, "task 'validation-0' opens as a held-out")],
)
def test_a_validation_fold_that_holds_held_out_games_is_refused_before_anything_is_played(tmp_path, env_id, says):
    with pytest.raises(FoldOverlapError, match="a decision's games must be none of the train or held-out") as err:
        AgentLoop(config_from_dict(_config(env_id)), tmp_path, progress=False)
    assert says in str(err.value) and isinstance(err.value, ConfigError)
    assert not (tmp_path / "memory.db").exists()  # refused before the store was opened


def test_a_short_validation_fold_is_a_warning_and_the_run_plays_what_there_is(tmp_path, caplog, capsys):
    config = config_from_dict(_config(SHORT))
    assert check_folds(config, tmp_path) == [
        f"{SHORT}: its validation fold holds 3 games and the decisions ask for 4; they play 3"
    ]
    with caplog.at_level(logging.WARNING):
        loop = AgentLoop(config, tmp_path, progress=False)
        loop.close()
    assert "validation fold holds 3 games" in capsys.readouterr().err


def test_a_promotion_too_small_to_see_the_quests_drop_is_a_warning_that_names_what_it_sees() -> None:
    small = config_from_dict(_config(SHORT, enabled=True, validation_games=8))
    (promotion, blind), _trial = decision_sights(small)
    assert blind and "acts at 2 games of 8 (25%)" in promotion and "give opcd.validation_games 14 or more" in promotion
    (promotion, blind), _trial = decision_sights(config_from_dict(_config(SHORT, enabled=True)))
    assert not blind and "on 20 validation games" in promotion and "14%" in promotion
