"""The gate's trials (`agent_runtime.phases.lesson_trials`): which games a decision plays, and what its reasons say."""

from __future__ import annotations

from pathlib import Path

from agent_runtime.config import config_from_dict
from agent_runtime.run.loop import AgentLoop
from distill.lessons import live_lessons
from memory import ExperienceStore
from tests.continual_envs import LEFT, RIGHT

NO_HELP = "Read the room before you move."


def _gated_run(workdir: Path, seed: list[str], **model_options) -> int:
    """Two rooms, a person's lessons proposed for both and gated (the gate's split left to its default)."""
    config = config_from_dict(
        {
            "name": "trials",
            "envs": [{"id": LEFT}, {"id": RIGHT}],
            "model": {"name": "scripted", "backend": "scripted", "options": {"follow_lessons": True, **model_options}},
            "runtime": {"slots": 4, "episodes": 4},
            "memory": {"embedder": "hash"},
            "evaluation": {"episodes_per_env": 4},
            "lessons": {"enabled": True, "seed": seed, "gate_episodes": 6, "extract_every": 1000},
        }
    )
    loop = AgentLoop(config, workdir, progress=False)
    try:
        return loop.run().run_id
    finally:
        loop.close()


def test_a_default_gate_plays_validation_games_never_the_held_out_ones(tmp_path: Path) -> None:
    run_id = _gated_run(tmp_path, ["Always reply: left"])
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        gates = store.evaluations(run_id, kind="gate")
    tasks = {key[1] for row in gates for key in row.metrics["keys"]}
    assert gates and tasks and all(task.startswith("validation-") for task in tasks), tasks


def test_a_lesson_kept_out_for_not_raising_success_is_said_to_be_kept_out(tmp_path: Path) -> None:
    """A person's lesson proposed everywhere must raise success to enter an environment; one that changes nothing
    (the policy always waits, and loses) is kept out, and every reason says so, not 'promoted'."""
    run_id = _gated_run(tmp_path, [NO_HELP], mode="fixed", fixed_answer="wait")
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        _, live = live_lessons(store, run_id)
        gates = {row.env_id: row.metrics for row in store.evaluations(run_id, kind="gate")}
        note = store.lesson_sets(run_id)[-1].note
    assert live == [] and set(gates) == {LEFT, RIGHT}
    for env_id, gate in gates.items():
        assert not gate["promote"], gate
        assert gate["reason"].startswith("kept out: it did not raise success (candidate 0.000 vs current 0.000 on 6")
        assert f"{env_id}: kept out: it did not raise success" in note
    assert "promoted" not in note, note
