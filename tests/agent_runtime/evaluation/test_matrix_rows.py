"""An assessment row that breaks what the continual matrix indexes with (a phase beyond the run's curriculum, a phase
that is not a number, games that are not games) is refused by `memory import` naming the row and the field, and one
already in a store makes `load_matrix` and `agent-runtime report` answer with that message, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.evaluation.matrix import load_matrix
from memory import ExperienceStore, ImportFormatError
from memory.errors import StoredRowError

ENVS = ["textworld/coin_collector", "math/gsm_symbolic"]
CONFIG = {
    "name": "continual",
    "envs": [{"id": env} for env in ENVS],
    "model": {"name": "scripted", "backend": "scripted"},
    "curriculum": {"phases": [{"envs": [ENVS[0]], "episodes": 4}, {"envs": [ENVS[1]], "episodes": 4}]},
}
GAMES = [{"task_id": f"t{i}", "seed": i, "won": i % 2 == 0} for i in range(4)]
BAD = [
    ({"continual": {"after_phase": 2_000_000, "label": "x"}, "episodes": GAMES}, 4, "after_phase"),
    ({"continual": {"after_phase": "x", "label": "x"}, "episodes": GAMES}, 4, "after_phase"),
    ({"continual": {"after_phase": -1, "label": "x"}, "episodes": GAMES}, 4, "after_phase"),
    (
        {"continual": {"after_phase": 1, "label": "x"}, "episodes": [{"task_id": "t", "seed": "s", "won": True}]},
        1,
        "seed",
    ),
    ({"continual": {"after_phase": 1, "label": "x"}, "episodes": [{"seed": 1}]}, 1, "won"),
    ({"continual": {"after_phase": 1, "label": "x"}, "episodes": GAMES}, -5, "num_episodes"),
]


def _assessed(store: ExperienceStore) -> int:
    run_id = store.create_run("continual", CONFIG)
    for env in ENVS:
        metrics = {"continual": {"after_phase": 0, "label": "start"}, "episodes": GAMES, "interval": [0.1, 0.9]}
        store.add_evaluation(env, run_id=run_id, num_episodes=4, success_rate=0.5, metrics=metrics)
    return run_id


def _matrix(store: ExperienceStore, run_id: int):
    config = config_from_dict(CONFIG)
    return load_matrix(store, run_id, config.curriculum, ENVS)


@pytest.mark.parametrize(("metrics", "num_episodes", "field"), BAD)
def test_a_bad_assessment_row_in_a_store_is_a_clear_error(tmp_path: Path, metrics, num_episodes, field, cli) -> None:
    with ExperienceStore.open(tmp_path) as store:
        run_id = _assessed(store)
        assert _matrix(store, run_id).rate(0, ENVS[0]) == 0.5
        bad = store.add_evaluation(ENVS[0], run_id=run_id, num_episodes=num_episodes, metrics=metrics)
        with pytest.raises(StoredRowError, match=f"evaluation {bad} .*{field}"):
            _matrix(store, run_id)
    for args in (("report",), ("report", "--json")):
        proc = cli(*args, "--workdir", tmp_path, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"evaluation {bad}" in proc.stderr and field in proc.stderr


def _export_with(tmp_path: Path, metrics: dict[str, Any], num_episodes: int) -> Path:
    with ExperienceStore.open(tmp_path / "src") as store:
        run_id = _assessed(store)
        store.add_evaluation(ENVS[0], run_id=run_id, num_episodes=4, metrics={"continual": {"after_phase": 1}})
        store.export_jsonl(tmp_path / "src.jsonl")
    lines = (tmp_path / "src.jsonl").read_text().splitlines()
    item = json.loads(lines[-2])
    assert item["table"] == "evaluations"
    item["row"] |= {"metrics": metrics, "num_episodes": num_episodes}
    lines[-2] = json.dumps(item)
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "bad.jsonl"


@pytest.mark.parametrize(("metrics", "num_episodes", "field"), BAD)
def test_an_import_refuses_a_bad_assessment_row_naming_it(tmp_path: Path, metrics, num_episodes, field) -> None:
    path = _export_with(tmp_path, metrics, num_episodes)
    lineno = len(path.read_text().splitlines()) - 1
    with ExperienceStore.open(tmp_path / "copy") as copy:
        with pytest.raises(ImportFormatError, match=rf"bad.jsonl:{lineno}: evaluation 3: .*{field}"):
            copy.import_jsonl(path)
        assert copy.runs() == []


def test_a_good_export_of_a_curriculum_run_imports(tmp_path: Path) -> None:
    path = _export_with(tmp_path, {"continual": {"after_phase": 2, "label": "after 2"}, "episodes": GAMES}, 4)
    with ExperienceStore.open(tmp_path / "copy") as copy:
        assert copy.import_jsonl(path)["evaluations"] == 3
        assert _matrix(copy, 1).rate(2, ENVS[0]) == 0.5
