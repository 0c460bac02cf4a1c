"""Every held-out evaluation of a run shows the agent as it acts: each environment's prompts hold what PLAY's held,
the lessons in scope there fitted to the run's lesson budget by the same selection."""

from __future__ import annotations

from pathlib import Path

from agent_runtime.curriculum import CurriculumConfig
from agent_runtime.evaluation.matrix import assess
from distill.lessons import live_lessons
from distill.lessons.scope import scoped_lessons
from tests.budgeted_lessons import LEFT, RIGHT, played_run


def test_run_evaluate_shows_each_environment_what_play_showed(tmp_path: Path) -> None:
    run, backend, play = played_run(tmp_path)
    for room in (LEFT, RIGHT):  # PLAY showed one lesson of the three in scope: each room's most relevant one
        [block] = play[room]
        assert block.count("\n- ") == 1, block
    assert play[LEFT] != play[RIGHT]
    with run.store:
        _, live = live_lessons(run.store, run.id)
        run.evaluate(backend, lessons=scoped_lessons(live), episodes_per_env=2)
    assert backend.blocks == play


def test_a_curriculum_assessment_shows_each_environment_what_play_showed(tmp_path: Path) -> None:
    run, backend, play = played_run(tmp_path)
    run.config = run.config.model_copy(
        update={"curriculum": CurriculumConfig(eval_episodes=2, phases=[{"envs": [LEFT, RIGHT], "episodes": 8}])}
    )
    with run.store:
        assert len(assess(run, backend, 0)) == 2
    assert backend.blocks == play
