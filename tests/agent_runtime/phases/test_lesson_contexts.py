"""An episode's lessons (`agent_runtime.phases.lesson_contexts.LessonContexts`): the drawn pool's lessons in scope
for its environment, fitted to the budget by measured gain and then similarity, and a live set changed by another
process picked up by the next draws."""

from __future__ import annotations

from pathlib import Path

from agent_runtime.episode.runner import Draw
from agent_runtime.phases.lesson_contexts import LessonContexts
from distill.lessons.versions import create_version
from memory import ExperienceStore
from memory.embeddings import HashEmbedder
from tests.continual_envs import LEFT, RIGHT

TWO = [(LEFT, "text"), (RIGHT, "text")]


def _live(store: ExperienceStore, run_id: int, specs: list[tuple[str, list[str]]]) -> list[int]:
    ids = [store.add_lesson(text, run_id=run_id, scope=scope, token_count=len(text.split())) for text, scope in specs]
    create_version(store, run_id, ids)
    return ids


def test_an_episode_shows_only_the_lessons_in_scope_for_its_environment(tmp_path: Path) -> None:
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(64)) as store:
        run_id = store.create_run("r", {})
        left, right, everywhere = _live(
            store, run_id, [("Take the left door.", [LEFT]), ("Take the right door.", [RIGHT]), ("Be quick.", ["*"])]
        )
        contexts = LessonContexts(store, run_id, 1, 0, envs=TWO)
        assert contexts.for_draw(Draw(0, 0, "train-0", 1)).lesson_ids == (left, everywhere)
        assert contexts.for_draw(Draw(1, 1, "train-0", 1)).lesson_ids == (right, everywhere)
        unscoped = LessonContexts(store, run_id, 1, 0)  # no environments known: every lesson, as before scopes
        assert unscoped.for_draw(Draw(0, 0, "train-0", 1)).lesson_ids == (left, right, everywhere)


def test_a_lessons_measured_gain_in_the_environment_outranks_similarity_under_the_budget(tmp_path: Path) -> None:
    """Room for one lesson of two: where a lesson's own trial raised the environment's success it is shown, though
    the other reads closer to the episode; where no trial measured either, similarity decides."""
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(64)) as store:
        run_id = store.create_run("r", {})
        near = store.add_lesson("Leave the red hall by the left door.", run_id=run_id, token_count=8)
        gains = {"scope_trials": {LEFT: {"delta": 0.25, "current_rate": 0.25, "candidate_rate": 0.5}}}
        tried = store.add_lesson("Doors matter.", run_id=run_id, token_count=2, metadata=gains)
        create_version(store, run_id, [near, tried])
        contexts = LessonContexts(store, run_id, 1, 0, envs=TWO, max_lessons=1)
        goal, observation = "Leave the red hall by the right door.", "Two doors, a red hall."
        left = contexts.choose(contexts.for_draw(Draw(0, 0, "train-0", 1)), LEFT, goal, observation)
        right = contexts.choose(contexts.for_draw(Draw(1, 1, "train-0", 1)), RIGHT, goal, observation)
        assert left.lesson_ids == (tried,) and right.lesson_ids == (near,)


def test_a_live_set_changed_meanwhile_reaches_the_next_draws_once_the_refresh_interval_passed(tmp_path: Path) -> None:
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(64)) as store:
        run_id = store.create_run("r", {})
        (first,) = _live(store, run_id, [("Take the left door.", ["*"])])
        contexts = LessonContexts(store, run_id, 1, 0, envs=TWO)
        contexts.REFRESH_SECONDS = 3600.0
        (second,) = _live(store, run_id, [("Knock first.", ["*"])])  # what `lessons add` in another process does
        draw = Draw(0, 0, "train-0", 1)
        assert contexts.for_draw(draw).lesson_ids == (first,)  # looked at less than the interval ago
        contexts.REFRESH_SECONDS = 0.0
        assert contexts.for_draw(draw).lesson_ids == (second,)
