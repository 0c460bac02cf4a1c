"""A long-lived run's rounds: each family's course over the rounds (best so far, drops, against its base) and the
one line each round prints."""

from __future__ import annotations

import pytest

from agent_runtime.evaluation.drift import choice_kl
from agent_runtime.evaluation.matrix import Matrix
from agent_runtime.evaluation.rounds import RoundRecord, courses, courses_table


def _matrix(rates: dict[str, list[float]], learned: dict[str, int]) -> Matrix:
    rows = len(next(iter(rates.values())))
    matrix = Matrix(["start", *(f"p{i}" for i in range(1, rows))], list(rates), learned)
    for env, column in rates.items():
        for row, rate in enumerate(column):
            wins = round(rate * 20)
            matrix.cells[(row, env)] = [True] * wins + [False] * (20 - wins)
    return matrix


def test_a_familys_largest_drop_below_its_best_so_far_and_its_lowest_against_its_base() -> None:
    # a: learned in round 1, peaks at 0.9, falls to 0.6, recovers to 0.8; b: learned in round 2, dips below base
    matrix = _matrix({"x/a": [0.1, 0.9, 0.6, 0.8], "x/b": [0.5, 0.5, 0.4, 0.5]}, {"x/a": 1, "x/b": 2})
    a, b = courses(matrix)
    assert a.best == pytest.approx(0.9) and a.largest_drop_below_best == pytest.approx(0.3)
    assert a.drop_below_best_at_end == pytest.approx(0.1)
    assert a.worst_below_base_after_learned == pytest.approx(0.5)  # 0.6 - 0.1: never below its base
    assert b.worst_below_base_after_learned == pytest.approx(-0.1)  # 0.4 in round 2, its own phase
    rows = {line.split()[0]: line.split() for line in courses_table(matrix).splitlines()[1:]}
    assert rows["a"][1:] == ["10%", "90%", "80%", "30", "10", "+50"]
    assert rows["b"][-1] == "-10"


def test_a_family_never_trained_has_no_figure_against_its_base() -> None:
    (c,) = courses(_matrix({"x/c": [0.4, 0.3]}, {}))
    assert c.worst_below_base_after_learned is None and c.largest_drop_below_best == pytest.approx(0.1)


def test_a_round_is_one_line_with_its_row_lessons_drift_and_time() -> None:
    record = RoundRecord(
        3,
        "coin \x1b]0;owned\x07",
        {"x/coin": 0.85, "x/quest": None},
        lessons={"x/coin": {"count": 2, "tokens": 41}},
        drift={"x/coin": 0.0123},
        seconds={"PLAY": 61.2, "CONSOLIDATE": 120.0},
        rss_mb=600.4,
        peak_rss_mb=1700.0,
    )
    line = record.line(["x/coin", "x/quest"], escape=lambda s: s.encode("unicode_escape").decode())
    assert "\n" not in line and "\x1b" not in line
    assert "coin 85%" in line and "quest -" in line and "coin 2/41t" in line and "coin 0.012" in line
    assert "PLAY 61s" in line and "CONSOLIDATE 120s" in line and "rss 600 MB (peak 1700)" in line


def test_choice_kl_is_zero_for_one_distribution_and_positive_otherwise() -> None:
    import math

    p = [math.log(0.7), math.log(0.2), math.log(0.1)]
    q = [math.log(0.2), math.log(0.5), math.log(0.3)]
    assert choice_kl(p, p) == pytest.approx(0.0)
    expected = 0.7 * math.log(0.7 / 0.2) + 0.2 * math.log(0.2 / 0.5) + 0.1 * math.log(0.1 / 0.3)
    assert choice_kl(p, q) == pytest.approx(expected)
    assert choice_kl([0.0, -math.inf], [math.log(0.5), math.log(0.5)]) == pytest.approx(math.log(2))


def test_a_curriculum_run_stores_and_prints_a_record_per_round_and_report_shows_the_rounds(
    tmp_path, capsys, caplog
) -> None:
    """Two rooms over three rounds (left, right, left), a person's "left" lesson gated in: every assessment row keeps
    the round's lessons and tokens per room, its drift and phase times; the run prints one line per round, and
    `report` prints every round and each family's course (text and JSON)."""
    import json

    from agent_runtime.cli import main
    from agent_runtime.config import config_from_dict
    from agent_runtime.run.loop import AgentLoop
    from memory import ExperienceStore
    from tests.continual_envs import LEFT, RIGHT

    config = {
        "name": "rounds",
        "envs": [{"id": LEFT}, {"id": RIGHT}],
        "model": {"name": "scripted", "backend": "scripted", "options": {"follow_lessons": True}},
        "runtime": {"slots": 4},
        "memory": {"embedder": "hash"},
        "evaluation": {"episodes_per_env": 4},
        "curriculum": {
            "eval_episodes": 4,
            "phases": [
                {"envs": [LEFT], "episodes": 4, "name": "left 1"},
                {"envs": [RIGHT], "episodes": 4, "name": "right 1"},
                {"envs": [LEFT], "episodes": 4, "name": "left 2"},
            ],
        },
        "lessons": {"enabled": True, "seed": ["Always reply: left"], "gate_episodes": 4, "extract_every": 1000},
    }
    loop = AgentLoop(config_from_dict(config), tmp_path, progress=False)
    try:
        loop.run()
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ASSESS")]
    assert len(lines) == 4 and all(" | lessons " in x and " | drift " in x and "PLAY" in x for x in lines[1:]), lines
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        rows = [e for e in store.evaluations(None, kind="eval") if "continual" in e.metrics]
    assert len(rows) == 8
    for row in rows:
        record = row.metrics["continual"]["round"]
        assert set(record["lessons"]) == {LEFT, RIGHT} and record["rss_mb"] > 0
        assert record["peak_rss_mb"] >= record["rss_mb"] and record["seconds"]["ASSESS"] > 0
    later = [r.metrics["continual"]["round"] for r in rows if r.metrics["continual"]["after_phase"] > 0]
    # the person's lesson was narrowed to the left room by its trial: it counts there from round 1, with its tokens
    assert all(r["lessons"][LEFT]["count"] >= 1 and r["lessons"][LEFT]["tokens"] > 3 for r in later)
    start = next(r.metrics["continual"]["round"] for r in rows if r.metrics["continual"]["after_phase"] == 0)
    assert start["lessons"][LEFT] == {"count": 0, "tokens": 0} and set(start["drift"].values()) <= {0.0}
    assert all(r["seconds"]["PLAY"] > 0 for r in later)

    capsys.readouterr()
    assert main(["report", "--workdir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "Each family over the rounds" in text and "Rounds:" in text
    assert sum(line.startswith("round ") for line in text.splitlines()) == 4
    assert main(["report", "--workdir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["after_phase"] for r in report["rounds"]] == [0, 1, 2, 3]
    courses = {c["env"]: c for c in report["courses"]}
    assert courses[LEFT]["base"] < courses[LEFT]["best"] == 1.0

    # the dashboard's learning page: the curve over every round, each family's course and every round's record
    from fastapi.testclient import TestClient

    from agent_runtime.dashboard import create_app

    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        page = client.get("/learning?run=1")
    assert page.status_code == 200
    courses_html = page.text.split('class="matrix continual-courses"')[1].split("</table>")[0]
    assert courses_html.count("<tr>") == 3 and LEFT in courses_html and RIGHT in courses_html
    rounds_html = page.text.split('class="matrix continual-rounds"')[1].split("</table>")[0]
    assert rounds_html.count("<tr>") == 5  # the header and rounds 0 to 3
    assert "left 2" in rounds_html and "PLAY s" in rounds_html
    left_row = courses_html.split(f"<td>{LEFT}</td>")[1].split("</tr>")[0]
    assert left_row.count('class="num"') == 6 and "+" in left_row  # trained in round 1, never below its base since
