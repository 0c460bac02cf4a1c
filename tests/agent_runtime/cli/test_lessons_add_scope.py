"""`agent-runtime lessons add --env`: a scope must name something the run has, or the lesson goes live nowhere."""

from __future__ import annotations

from pathlib import Path

import yaml

from agent_runtime.cli import main
from tests.continual_envs import LEFT, RIGHT


def test_lessons_add_refuses_a_family_no_environment_of_the_run_has(tmp_path: Path, capsys) -> None:
    path = tmp_path / "c.yaml"
    config = {
        "name": "scoped",
        "envs": [{"id": LEFT}, {"id": RIGHT}],
        "model": {"name": "scripted", "backend": "scripted"},
        "memory": {"embedder": "hash"},
        "lessons": {"gate_episodes": 0},
    }
    path.write_text(yaml.safe_dump(config))
    work = tmp_path / "w"
    add = ["lessons", "add", "Go left.", "--config", str(path), "--workdir", str(work), "--env"]
    assert main([*add, "family:math"]) == 2
    err = capsys.readouterr().err
    assert "'family:math' names a family no environment of this run has; its families: family:text" in err
    assert main([*add, "family:text"]) == 0
