"""Every prompt a phase judges or teaches the agent with holds what PLAY's held: the gate's trials, a cycle's
evaluation with lessons and the OPCD teacher's context show each environment its lessons in scope, fitted to the
run's lesson budget by PLAY's selection."""

from __future__ import annotations

from pathlib import Path

from agent_runtime.phases.consolidate import start_cycle
from agent_runtime.phases.cycle_evaluation import evaluate_cycle
from agent_runtime.phases.lesson_trials import GameTrials
from agent_runtime.phases.turn_prompts import recent_decisions
from distill.lessons import live_lessons, render_lessons
from distill.lessons.scope import scoped_lessons
from tests.budgeted_lessons import LEFT, RIGHT, played_run


def test_the_gates_trials_show_each_environment_what_play_showed(tmp_path: Path) -> None:
    run, backend, play = played_run(tmp_path)
    with run.store:
        _, live = live_lessons(run.store, run.id)
        won = GameTrials(run, backend)(scoped_lessons(live))
    assert {env for env, _, _ in won} == {LEFT, RIGHT}
    assert backend.blocks == play


def test_a_cycles_evaluation_with_lessons_shows_each_environment_what_play_showed(tmp_path: Path) -> None:
    run, backend, play = played_run(tmp_path)
    with run.store:
        cycle = start_cycle(run)
        cycle.adapter_id = run.store.add_adapter("student", str(tmp_path / "student"), run_id=run.id)
        evals = evaluate_cycle(run, backend, cycle)
    assert {r.env_id for r in evals["student_with_lessons"]} == {LEFT, RIGHT}
    assert backend.blocks == {room: {"", *blocks} for room, blocks in play.items()}  # without, and with, lessons


def test_the_teachers_context_for_a_decision_is_what_its_episodes_prompt_held(tmp_path: Path) -> None:
    run, backend, play = played_run(tmp_path)
    with run.store:
        cycle = start_cycle(run)
        decisions = recent_decisions(run, backend)
        assert {d.env_id for d in decisions} == {LEFT, RIGHT}
        for decision in decisions:
            [shown] = cycle.contexts_for(decision)
            episode = run.store.episode(decision.episode_ids[0])
            held = {x.id: x.text for x in run.store.lessons(run.id, ids=episode.lessons_in_context)}
            assert play[decision.env_id] == {shown}
            assert shown == render_lessons([held[i] for i in episode.lessons_in_context])
