"""`agent-runtime eval` shows each environment what PLAY would: only the live lessons in its scope, fitted to the
run's lesson budget by PLAY's selection."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from agent_runtime.cli import main
from agent_runtime.config import config_from_dict
from distill.lessons.versions import create_version
from memory import ExperienceStore
from tests.budgeted_lessons import CONFIG, played_run
from tests.continual_envs import LEFT, RIGHT


def _config_file(directory: Path, config: dict) -> Path:
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_eval_shows_a_lesson_only_in_the_environments_of_its_scope(tmp_path: Path, capsys) -> None:
    """Each room's lesson wins every game there and loses every game in the other room (its policy does what the
    one lesson in its prompt says, and follows neither of two that disagree)."""
    config = {**CONFIG, "model": {"name": "scripted", "backend": "scripted", "options": {"follow_lessons": True}}}
    config["evaluation"] = {"episodes_per_env": 6}
    with ExperienceStore.open(tmp_path, embedder="hash") as store:
        run_id = store.create_run(config["name"], config_from_dict(config).model_dump(mode="json"))
        ids = [
            store.add_lesson("Always reply: left", run_id=run_id, scope=[LEFT], token_count=3),
            store.add_lesson("Always reply: right", run_id=run_id, scope=[RIGHT], token_count=3),
        ]
        create_version(store, run_id, ids)
    path = _config_file(tmp_path, config)
    capsys.readouterr()
    assert main(["eval", str(path), "--workdir", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["env_id"]: row["success_rate"] for row in rows} == {LEFT: 1.0, RIGHT: 1.0}


def test_eval_shows_each_environment_what_play_showed(tmp_path: Path, monkeypatch, capsys) -> None:
    run, backend, play = played_run(tmp_path)
    run.store.close()
    monkeypatch.setattr("agent_runtime.llm.make_backend", lambda model, seed=0: backend)
    path = _config_file(tmp_path, CONFIG)
    assert main(["eval", str(path), "--workdir", str(tmp_path), "--json"]) == 0
    assert backend.blocks == play
