"""The learning page of a run whose store holds a bad assessment row (written around the store's checks) answers at
once with a small page naming the row and the field, in place of the continual matrix: not a 500, not a page of as
many matrix rows as the bad phase number says."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agent_runtime.dashboard import create_app
from memory import ExperienceStore

ENVS = ["textworld/coin_collector", "math/gsm_symbolic"]
CONFIG = {
    "name": "c",
    "curriculum": {"phases": [{"envs": [ENVS[0]], "episodes": 4}, {"envs": [ENVS[1]], "episodes": 4}]},
}
GAMES = [{"task_id": f"t{i}", "seed": i, "won": i % 2 == 0} for i in range(4)]


@pytest.mark.parametrize(
    ("after_phase", "shown"),
    [
        (2_000_000, "after_phase must be a phase of the run&#39;s curriculum (an integer from 0 to 2), got 2000000"),
        ("x", "got &#39;x&#39;"),
    ],
)
def test_a_bad_assessment_row_is_named_on_the_learning_page(tmp_path: Path, after_phase, shown) -> None:
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run("c", CONFIG)
        for env in ENVS:
            metrics = {"continual": {"after_phase": 0, "label": "start"}, "episodes": GAMES}
            store.add_evaluation(env, run_id=run_id, num_episodes=4, metrics=metrics)
        good = TestClient(create_app(tmp_path), base_url="http://127.0.0.1").get(f"/learning?run={run_id}")
        assert good.status_code == 200 and "continual-matrix" in good.text
        bad = store.add_evaluation(
            ENVS[0], run_id=run_id, num_episodes=4, metrics={"continual": {"after_phase": after_phase, "label": "<b>"}}
        )
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        started = time.perf_counter()
        page = client.get(f"/learning?run={run_id}")
        took = time.perf_counter() - started
    assert page.status_code == 200 and took < 5 and len(page.content) < 200_000
    assert f"evaluation {bad} ({ENVS[0]})" in page.text and shown in page.text
    assert "continual-matrix" not in page.text
