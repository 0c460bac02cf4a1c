"""What `run` prints of names from a config or a store (curriculum phase names, env ids) reaches the terminal
escaped: an OSC title sequence or a colour code in a phase name is shown, never obeyed."""

from __future__ import annotations

from pathlib import Path

import yaml

from agent_runtime.cli import main
from agent_runtime.curriculum import CurriculumConfig
from agent_runtime.evaluation.matrix import matrix_shape
from tests.continual_envs import LEFT, RIGHT

HOSTILE = "\x1b]0;pwned\x07\x1b[31mred"


def test_the_matrix_escapes_phase_names() -> None:
    curriculum = CurriculumConfig(phases=[{"envs": [LEFT], "episodes": 4, "name": HOSTILE}])
    matrix = matrix_shape(curriculum, [LEFT])
    matrix.cells = {(0, LEFT): [True], (1, LEFT): [False]}
    table = matrix.table()
    assert "\x1b" not in table and "\x07" not in table
    assert "after 1: \\x1b]0;pwned\\x07\\x1b[31mred" in table


def test_run_prints_assess_lines_and_the_matrix_escaped(tmp_path: Path, capsys) -> None:
    config = {
        "name": "escaped",
        "envs": [{"id": LEFT}, {"id": RIGHT}],
        "model": {"name": "scripted", "backend": "scripted"},
        "memory": {"embedder": "hash"},
        "runtime": {"slots": 2},
        "curriculum": {"eval_episodes": 2, "phases": [{"envs": [LEFT], "episodes": 2, "name": HOSTILE}]},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"]) == 0
    out = capsys.readouterr()
    printed = out.out + out.err
    assert "ASSESS after phase 1 (\\x1b]0;pwned" in printed and "after 1: \\x1b]0;pwned" in printed
    assert "\x1b" not in printed and "\x07" not in printed
