"""The dashboard through FastAPI's TestClient: every route, the safety rules, and the reads behind them.

The store is the demo store (`memory.testing.seed_demo_store`) plus a hostile episode and lesson whose
text is `<script>alert(1)</script>` (the `seed_with_xss` fixture), written through the ExperienceStore
API into a temporary SQLite file; the app opens it read-only. `tests/agent_runtime/dashboard/test_dashboard_browser.py` drives
the same app in Chromium.
"""

from __future__ import annotations

import hashlib
import html
import math
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from agent_runtime.dashboard import app as dashboard_app
from agent_runtime.dashboard import create_app, learning_view, reads, serve
from memory import (
    EVALUATION_GATE,
    EVALUATION_LESSON_UTILITY,
    LESSON_SET_CANDIDATE,
    MADE_BY_USER,
    ExperienceStore,
    ReadOnlyStoreError,
    StepRecord,
    StoreUnavailableError,
)
from memory.intervals import wilson_interval
from memory.testing import DEMO_ENVS, game_episode

XSS = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
PACKAGE = Path(dashboard_app.__file__).parent


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory, seed_with_xss) -> tuple[Path, dict[str, int]]:
    workdir = tmp_path_factory.mktemp("dashboard")
    return workdir, seed_with_xss(workdir)


@pytest.fixture(scope="module")
def client(seeded: tuple[Path, dict[str, int]]) -> TestClient:
    workdir, _ = seeded
    with TestClient(create_app(workdir), base_url="http://127.0.0.1") as test_client:
        yield test_client


def page_urls(ids: dict[str, int]) -> list[str]:
    run, cycle = ids["run"], ids["cycle"]
    return [
        "/",
        f"/?run={run}",
        f"/partials/overview?run={run}",
        "/learning",
        f"/learning?run={run}&window=5",
        "/episodes",
        f"/episodes?run={run}&env={DEMO_ENVS[0]}&outcome=won&page=1",
        f"/episodes/{ids['xss_episode']}",
        "/lessons",
        f"/lessons?run={run}&status=active&pool=0",
        "/lessons/versions",
        f"/lessons/{ids['xss_lesson']}",
        "/cycles",
        f"/cycles/{cycle}",
        "/search",
        "/search?q=frozen+lake",
        f"/episodes/{ids['xss_episode']}/steps/0/prompt",
    ]


def test_every_page_renders_with_csp(client: TestClient, seeded: tuple[Path, dict[str, int]]) -> None:
    _, ids = seeded
    for url in page_urls(ids):
        response = client.get(url)
        assert response.status_code == 200, (url, response.text[:500])
        assert response.headers["content-type"].startswith("text/html"), url
        assert "default-src 'self'" in response.headers["content-security-policy"], url
        assert response.headers["x-content-type-options"] == "nosniff"
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", response.text), f"{url} links off-site"


def test_json_chart_endpoints(client: TestClient, seeded: tuple[Path, dict[str, int]]) -> None:
    _, ids = seeded
    success = client.get(f"/api/runs/{ids['run']}/success.json").json()["charts"]
    per_env, lessons = success
    assert (
        per_env["marks"]
        == lessons["marks"]
        == [{"x": 60, "label": f"cycle {ids['cycle']} promoted", "status": "promoted"}]
    )
    assert {s["label"] for s in per_env["series"]} == set(DEMO_ENVS)
    assert {s["label"] for s in lessons["series"]} == {"with lessons", "without lessons"}
    assert per_env["x"] == sorted(per_env["x"]) and per_env["x"][-1] == 61
    for series in per_env["series"] + lessons["series"]:
        assert len(series["values"]) == len(per_env["x"])
        assert all(v is None or 0.0 <= v <= 1.0 for v in series["values"])
    curves = client.get(f"/api/cycles/{ids['cycle']}/curves.json").json()["charts"]
    assert [c["title"] for c in curves] == ["kl", "loss"]
    assert len(curves[1]["x"]) == 60
    rewards = client.get(f"/api/episodes/{ids['xss_episode']}/rewards.json").json()["charts"][0]
    assert [s["label"] for s in rewards["series"]] == ["reward", "return so far"]
    assert client.get("/api/episodes/999999/rewards.json").status_code == 404
    assert client.get("/api/episodes/999999/rewards.json").json()["detail"].startswith("no episode")


def test_rolling_success_rate_and_cycle_marks(tmp_path: Path) -> None:
    with ExperienceStore.open(tmp_path) as store:
        run = store.create_run("tiny", {})
        for won in (True, False, True, True):
            store.add_episode(run, game_episode(DEMO_ENVS[0], "t", won=won, n_steps=1))
        cycle = store.start_cycle(run, {})
        store.add_episode(run, game_episode(DEMO_ENVS[0], "t", won=False, n_steps=1, lessons_in_context=[]))
        store.update_cycle(cycle, status="failed", ended=True)
    client = TestClient(create_app(tmp_path), base_url="http://127.0.0.1")
    per_env, with_without = client.get(f"/api/runs/{run}/success.json?window=2").json()["charts"]
    assert per_env["x"] == [1, 2, 3, 4, 5]
    assert per_env["series"] == [{"label": DEMO_ENVS[0], "values": [1.0, 0.5, 0.5, 1.0, 0.5]}]
    assert with_without["series"][0]["label"] == "without lessons"
    assert per_env["marks"] == [{"x": 5, "label": f"cycle {cycle} failed", "status": "failed"}]


def test_model_text_is_escaped(client: TestClient, seeded: tuple[Path, dict[str, int]]) -> None:
    _, ids = seeded
    for url in (
        f"/episodes/{ids['xss_episode']}",
        f"/lessons/{ids['xss_lesson']}",
        "/lessons",
        f"/episodes/{ids['xss_episode']}/steps/0/prompt",
        f"/episodes?run={ids['run']}",
        "/search?q=never+trust+a+room+description",
    ):
        body = client.get(url).text
        assert XSS not in body, url
        assert ESCAPED in body, url


def test_prompts_load_on_demand(client: TestClient, seeded: tuple[Path, dict[str, int]]) -> None:
    _, ids = seeded
    episode = client.get(f"/episodes/{ids['xss_episode']}").text
    assert "prompt &lt;script&gt;" not in episode  # long prompts stay out of the episode page
    assert f'hx-get="/episodes/{ids["xss_episode"]}/steps/0/prompt"' in episode
    fragment = client.get(f"/episodes/{ids['xss_episode']}/steps/0/prompt", headers={"HX-Request": "true"})
    assert fragment.text == f"prompt {ESCAPED}"
    assert client.get(f"/episodes/{ids['xss_episode']}/steps/99/prompt").status_code == 404


def test_episode_page_shows_trajectory_and_provenance(client: TestClient, seeded: tuple[Path, dict[str, int]]) -> None:
    _, ids = seeded
    body = client.get(f"/episodes/{ids['xss_episode']}").text
    assert body.count('class="step"') >= 2
    assert "admissible actions" in body and "ACTION:" in body
    assert f'href="/lessons/{ids["xss_lesson"]}"' in body  # the lesson that came from it
    lesson = client.get(f"/lessons/{ids['xss_lesson']}").text
    assert f'href="/episodes/{ids["xss_episode"]}"' in lesson and "extractor response" in lesson


def test_cycle_page_shows_decision_evaluations_and_lineage(
    client: TestClient, seeded: tuple[Path, dict[str, int]]
) -> None:
    _, ids = seeded
    body = client.get(f"/cycles/{ids['cycle']}").text
    assert "promoted: the adapter became the active one" in body
    assert "student without lessons reached 92%" in body
    for condition in (
        "consolidated adapter, no lessons",
        "consolidated adapter + lessons",
        "base policy + lessons in context",
        "base policy, no lessons",
        "retention: consolidated adapter",
    ):
        assert condition in body
    assert "adapter-1" in body and "base model" in body
    low, high = wilson_interval(11, 20)  # the demo's teacher with lessons on its first environment
    assert f"{100 * low:.1f}% to {100 * high:.1f}%" in body


def test_episode_filters_and_paging(client: TestClient, seeded: tuple[Path, dict[str, int]]) -> None:
    _, ids = seeded
    won = client.get("/episodes?outcome=won&per_page=500").text
    assert "badge lost" not in won and "badge won" in won
    env = client.get(f"/episodes?env={DEMO_ENVS[1]}&per_page=500").text
    assert DEMO_ENVS[0] not in re.sub(r"<option.*?</option>", "", env)
    assert "1 episode ·" in client.get("/episodes?task=alert").text
    assert "61 episodes · page 1 of 2" in client.get(f"/episodes?run={ids['run']}").text
    page2 = client.get(f"/episodes?run={ids['run']}&page=2").text
    assert "page 2 of 2" in page2 and 'href="/episodes/1"' in page2
    fragment = client.get("/episodes?outcome=lost", headers={"HX-Request": "true"}).text
    assert fragment.startswith('<div id="episode-table">') and "<html" not in fragment
    restore = client.get("/episodes", headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}).text
    assert "<html" in restore
    assert client.get("/episodes?lsv=1").status_code == 200


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/episodes?page=abc", 400),
        ("/episodes?outcome=bogus", 400),
        ("/lessons?status=bogus", 400),
        ("/episodes/999999", 404),
        ("/cycles/999999", 404),
        ("/lessons/999999", 404),
        ("/?run=999", 404),
        ("/search?kind=bogus&q=x", 400),
        ("/no/such/page", 404),
    ],
)
def test_bad_requests_get_clear_errors(client: TestClient, url: str, status: int) -> None:
    response = client.get(url)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in response.headers["content-security-policy"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("url", ["/", "/episodes/1", "/static/dashboard.js", "/nowhere"])
def test_writes_are_405(client: TestClient, method: str, url: str) -> None:
    response = client.request(method, url, json={"text": "x"})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"


def test_head_is_allowed(client: TestClient) -> None:
    for url in ("/", "/episodes", "/api/runs/1/success.json", "/static/dashboard.css"):
        response = client.head(url)
        assert response.status_code == 200, url
        assert response.content == b"" and int(response.headers["content-length"]) > 0


def test_store_is_read_only_at_the_driver(seeded: tuple[Path, dict[str, int]]) -> None:
    workdir, ids = seeded
    db = workdir / "memory.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    app = create_app(workdir)
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        for url in page_urls(ids):
            assert test_client.get(url).status_code == 200
        store = app.state.store
        assert store.read_only
        with pytest.raises(ReadOnlyStoreError):
            store.add_lesson("sneaky")
        with pytest.raises(OperationalError, match="readonly"), store.engine.begin() as conn:
            conn.execute(text("UPDATE lessons SET text = 'changed'"))
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_postgres_store_is_read_only(tmp_path: Path, pg_url: str) -> None:
    url = pg_url
    with ExperienceStore.open(url, index_dir=tmp_path) as store:
        run = store.create_run("pg", {})
        episode = store.add_episode(run, game_episode(DEMO_ENVS[0], "t", won=True, observation=XSS))
    app = create_app(url)
    with TestClient(app, base_url="http://127.0.0.1") as test_client:
        assert ESCAPED in test_client.get(f"/episodes/{episode}").text
        with pytest.raises(Exception, match="read-only transaction"), app.state.store.engine.begin() as conn:
            conn.execute(text("UPDATE lessons SET text = 'changed'"))


def test_token_is_required_when_configured(seeded: tuple[Path, dict[str, int]]) -> None:
    workdir, _ = seeded
    app = create_app(workdir, token="s3cret")
    with TestClient(app, base_url="http://192.168.1.5:8765", follow_redirects=False) as anonymous:
        for url in ("/", "/episodes", "/static/dashboard.js", "/api/runs/1/success.json"):
            assert anonymous.get(url).status_code == 401, url
        assert anonymous.get("/?token=wrong").status_code == 401
        assert anonymous.get("/lessons", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert anonymous.get("/lessons", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        login = anonymous.get("/episodes?token=s3cret&page=1")
        assert login.status_code == 303 and login.headers["location"] == "/episodes?page=1"
        cookie = login.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        assert anonymous.get("/episodes?page=1").status_code == 200  # the cookie now carries it
        assert anonymous.post("/episodes").status_code == 405


def test_host_header_is_checked_without_token(seeded: tuple[Path, dict[str, int]]) -> None:
    workdir, _ = seeded
    app = create_app(workdir)
    assert TestClient(app, base_url="http://evil.example").get("/").status_code == 400
    assert TestClient(app, base_url="http://localhost:8765").get("/").status_code == 200
    assert TestClient(app, base_url="http://[::1]:8765").get("/").status_code == 200


def test_serve_binds_loopback_and_generates_a_token_otherwise(
    seeded: tuple[Path, dict[str, int]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    workdir, _ = seeded
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append({"app": app, **kw}))
    serve(workdir)
    assert calls[-1]["host"] == "127.0.0.1" and calls[-1]["port"] == 8765
    assert "token" not in capsys.readouterr().out
    serve(workdir, host="0.0.0.0", port=9999)
    printed = capsys.readouterr().out
    token = re.search(r"\?token=(\S+)", printed).group(1)
    assert len(token) >= 24 and "http://0.0.0.0:9999/" in printed
    remote = TestClient(calls[-1]["app"], base_url="http://10.0.0.2:9999")
    assert remote.get("/").status_code == 401
    assert remote.get("/", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    serve(workdir, host="0.0.0.0", token="given")
    assert "?token=given" in capsys.readouterr().out


def test_empty_and_missing_stores(tmp_path: Path) -> None:
    ExperienceStore.open(tmp_path / "empty").close()
    client = TestClient(create_app(tmp_path / "empty"), base_url="http://127.0.0.1")
    for url in ("/", "/episodes", "/lessons", "/lessons/versions", "/cycles", "/search?q=anything"):
        assert client.get(url).status_code == 200, url
    assert "No runs yet" in client.get("/").text
    assert "no vectors are stored yet" in client.get("/search?q=anything").text
    with pytest.raises(StoreUnavailableError, match="no memory database"):
        create_app(tmp_path / "nowhere")


def test_search_finds_lessons_and_episodes(client: TestClient) -> None:
    body = client.get("/search?q=frozen+lake+hole+tile&kind=lessons").text
    assert '/lessons/1"' in body and "Before stepping, check whether the next tile is a hole" in body
    episodes = client.get("/search?q=frozen+lake&kind=episodes", headers={"HX-Request": "true"}).text
    assert episodes.startswith('<div id="search-results">') and 'href="/episodes/' in episodes


def test_curve_formats() -> None:
    charts, skipped = reads.curve_charts(
        {
            "loss": [1.0, 0.5, float("nan")],
            "kl": [[0, 0.3], [10, 0.2]],
            "lr": {"step": [0, 1], "value": [1e-6, 2e-6]},
            "notes": ["a", "b"],
        }
    )
    by_name = {c.title: c for c in charts}
    assert by_name["loss"].series["loss"] == [1.0, 0.5, None]
    assert by_name["kl"].x == [0.0, 10.0]
    assert by_name["lr"].series["lr"] == [1e-6, 2e-6]
    assert skipped == ["notes"]
    history, _ = reads.curve_charts(
        {"history": [{"step": 1, "loss": 2.0, "objective": "opcd"}, {"step": 2, "loss": 1.5, "objective": "opcd"}]}
    )
    assert [(c.title, c.x, c.series["loss"]) for c in history] == [("loss", [1.0, 2.0], [2.0, 1.5])]


def test_vendored_assets_match_vendor_md() -> None:
    vendor = (PACKAGE / "VENDOR.md").read_text()
    listed = re.findall(r"\| `static/([^`]+)` \|[^|]+\|[^|]+\| `([0-9a-f]{64})` \|", vendor)
    assert len(listed) == 3
    for name, digest in listed:
        assert re.search(r"-\d+\.\d+\.\d+\.min\.(js|css)$", name), f"{name} lacks its version"
        assert hashlib.sha256((PACKAGE / "static" / name).read_bytes()).hexdigest() == digest, name
    referenced = set(re.findall(r"/static/([\w.-]+)", (PACKAGE / "templates" / "base.html").read_text()))
    assert referenced == {n for n, _ in listed} | {"dashboard.css", "dashboard.js"}
    assert all((PACKAGE / "static" / n).is_file() for n in referenced)


def test_static_assets_are_served(client: TestClient) -> None:
    response = client.get("/static/uplot-1.6.32.min.js")
    assert response.status_code == 200 and "javascript" in response.headers["content-type"]
    assert response.content.startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


def test_dashboard_imports_only_memory_of_ours() -> None:
    import ast

    ours = {"agent_runtime", "environments", "distill", "memory", "modelkit"}
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            for name in names:
                top = name.split(".")[0]
                if top in ours:
                    assert top == "memory" or name.startswith("agent_runtime.dashboard"), f"{path.name} imports {name}"


def test_lessons_are_paged(client: TestClient, seeded: tuple[Path, dict[str, int]]) -> None:
    _, ids = seeded
    with ExperienceStore.open(seeded[0], read_only=True) as store:
        total = store.count_lessons(ids["run"])
    assert total >= 4, "the demo store has several lessons"
    listed = []
    page = 1
    while True:
        body = client.get(f"/lessons?run={ids['run']}&per_page=3&page={page}").text
        assert f"lessons ({total})" in body and f"page {page} of {-(-total // 3)}" in body
        table = body.split("<tbody>")[1].split("</tbody>")[0]
        listed += [int(i) for i in re.findall(r'<td><a href="/lessons/(\d+)">', table)]
        if "newer →" not in body:
            break
        assert f"page={page + 1}" in body
        page += 1
    assert len(listed) == total == len(set(listed)) and listed == sorted(listed), "each lesson once, oldest first"


def test_lesson_pages_read_the_state_columns(tmp_path: Path) -> None:
    """The current set is the live version, not a newer pending candidate; the versions page shows each
    version's status and who made it; gate decisions and utilities are found by their kind, not their split."""
    with ExperienceStore.open(tmp_path) as store:
        run = store.create_run("r", {})
        live = store.add_lesson("Live lesson text.", run_id=run, status="active")
        pending = store.add_lesson("Pending lesson text.", run_id=run)
        v1 = store.create_lesson_set(run, [live], note="first").version
        v2 = store.create_lesson_set(
            run, [live, pending], note="awaiting the gate", status=LESSON_SET_CANDIDATE, made_by=MADE_BY_USER
        ).version
        store.add_evaluation(
            "*",
            run_id=run,
            lesson_set_version=v2,
            kind=EVALUATION_GATE,
            split="eval",
            num_episodes=4,
            metrics={"promote": False, "reason": "blocked: worse by 0.5"},
        )
        store.add_evaluation("*", run_id=run, lesson_set_version=v1, split="gate", metrics={"promote": True})
        store.add_evaluation(
            "*",
            run_id=run,
            kind=EVALUATION_LESSON_UTILITY,
            split="eval",
            metrics={"utilities": {str(live): {"utility": 0.25}}},
        )
        store.add_evaluation(
            "*", run_id=run, split="lesson-utility", metrics={"utilities": {str(live): {"utility": -1}}}
        )
        assert set(reads.gate_decisions(store, run)) == {v2}, "a policy evaluation named 'gate' is not a decision"
        assert {k: m.entry for k, m in store.latest_lesson_utilities(run, [live]).items()} == {live: {"utility": 0.25}}
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        current = client.get(f"/lessons?run={run}").text.split("<section>")[1]
        assert f"Current set: version {v1} " in current and "first" in current
        assert "Live lesson text." in current and "Pending lesson text." not in current
        versions = client.get(f"/lessons/versions?run={run}").text
    newest, oldest = versions.split('<article class="version">')[1:]
    assert (
        f'version {v2} <span class="badge candidate">candidate</span> <span class="badge">by a person</span>' in newest
    )
    assert "blocked: worse by 0.5" in newest and "awaiting the gate" in newest
    assert f'version {v1} <span class="badge live">live</span> <small>' in oldest and "validation gate" not in oldest


# -- the learning view -------------------------------------------------------------------------

LEARNING_WINS = (False, False, True, True, False, True, True, True, True, False)


def seed_learning_store(target: Path | str, **open_options: Any) -> dict[str, Any]:
    """Ten episodes: three without lessons, three with lesson-set v1, one with v1 and a new adapter,
    three with v2 and the adapter (an episode of another run in between); one promoted cycle with
    evaluations (two environments pooled, a stored interval, a differently spelt condition, an
    unknown `random` condition, a condition named only by its policy) and a running one without."""
    with ExperienceStore.open(target, **open_options) as store:
        run = store.create_run("learning", {})
        other = store.create_run("other", {})
        lesson = store.add_lesson("Look before you leap.", run_id=run)
        v1 = store.create_lesson_set(run, [lesson]).version
        cycle = store.start_cycle(run, {}, lesson_set_version=v1)
        adapter = store.add_adapter("cycle-1", "adapters/cycle-1", run_id=run)
        store.update_cycle(cycle, adapter_id=adapter, metrics={"heldout_kl": {"before": 0.8, "after": 0.2}})
        v2 = store.create_lesson_set(run, [lesson]).version
        ids = {"run": run, "cycle": cycle, "adapter": adapter, "v1": v1, "v2": v2, "episodes": []}
        for i, won in enumerate(LEARNING_WINS):
            version = None if i < 3 else (v1 if i < 7 else v2)
            record = game_episode(
                DEMO_ENVS[0],
                f"t{i}",
                won=won,
                n_steps=1,
                seed=i,
                lesson_set_version=version,
                adapter_id=adapter if i >= 6 else None,
                lessons_in_context=[lesson] if version else (),
            )
            ids["episodes"].append(store.add_episode(run, record))
            if i == 4:
                store.add_episode(other, game_episode(DEMO_ENVS[1], "elsewhere", won=True, n_steps=1))
        for condition, env_id, n, rate, extra in (
            ("teacher_without_lessons", DEMO_ENVS[0], 10, 0.3, {}),
            ("teacher_without_lessons", DEMO_ENVS[1], 10, 0.5, {}),
            ("teacher_with_lessons", DEMO_ENVS[0], 20, 0.75, {"ci95": [0.5, 0.9]}),
            ("student without lessons", DEMO_ENVS[0], 20, 0.7, {}),
            ("random", DEMO_ENVS[0], 20, 0.1, {"ci95": [0.03, 0.3]}),
            (None, DEMO_ENVS[0], 4, 0.5, {}),
        ):
            metrics = {"episodes": [{"won": True}] * n, **extra}
            if condition:
                metrics["condition"] = condition
            store.add_evaluation(
                env_id,
                run_id=run,
                cycle_id=cycle,
                adapter_id=adapter,
                split="eval",
                policy="Out-of-distribution probe",
                num_episodes=n,
                success_rate=rate,
                metrics=metrics,
            )
        store.add_evaluation(
            "*",
            run_id=run,
            cycle_id=cycle,
            kind=EVALUATION_LESSON_UTILITY,
            num_episodes=99,
            success_rate=1.0,
            metrics={"condition": "teacher_with_lessons"},
        )
        store.promote_cycle(cycle, [])
        ids["running_cycle"] = store.start_cycle(run, {}, lesson_set_version=v2, base_adapter_id=adapter)
        step = StepRecord(
            index=0,
            observation="a fork",
            prompt="p",
            response="ACTION: go north",
            action="go north",
            valid_action=True,
            reward=0.0,
            admissible_actions=["go north", f"<b>go south</b> {XSS}", "wait"],
            info={"action_mode": "choice", "choice_logprobs": [math.log(0.7), math.log(0.2), math.log(0.1)]},
        )
        skewed = StepRecord(
            index=1,
            observation="again",
            prompt="p",
            response="ACTION: wait",
            action="wait",
            valid_action=True,
            reward=0.0,
            admissible_actions=["go north", "wait", "look"],
            info={"action_mode": "choice", "choice_logprobs": [-0.1, -2.0]},
        )
        free = StepRecord(
            index=2,
            observation="free text",
            prompt="p",
            response="ACTION: look",
            action="look",
            valid_action=True,
            reward=1.0,
            admissible_actions=["look"],
            info={"action_mode": "text"},
        )
        record = game_episode(DEMO_ENVS[0], "choice", won=True, n_steps=1)
        record.steps = [step, skewed, free]
        ids["choice_episode"] = store.add_episode(other, record)
    return ids


@pytest.fixture(scope="module")
def learning_client(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("learning")
    ids = seed_learning_store(workdir)
    with TestClient(create_app(workdir), base_url="http://127.0.0.1") as test_client:
        yield test_client, ids


def expected_rolling(window: int) -> list[tuple[float, int]]:
    wins = [int(w) for w in LEARNING_WINS]
    return [(sum(wins[max(0, i - window + 1) : i + 1]), min(window, i + 1)) for i in range(len(wins))]


def test_learning_curve_rolling_rate_band_and_marks(learning_client: tuple[TestClient, dict[str, Any]]) -> None:
    client, ids = learning_client
    payload = client.get(f"/api/runs/{ids['run']}/learning.json?window=3").json()
    (chart,) = payload["charts"]
    assert chart["x"] == list(range(1, 11)), "x is the episode's ordinal in its run, not its id"
    series = {s["label"]: s["values"] for s in chart["series"]}
    assert list(series) == ["success (last 3)", "95% high", "95% low"]
    assert chart["bands"] == [{"upper": "95% high", "lower": "95% low"}]
    expected = expected_rolling(3)
    assert series["success (last 3)"] == pytest.approx([w / n for w, n in expected])
    assert series["success (last 3)"][:4] == pytest.approx([0.0, 0.0, 1 / 3, 2 / 3])
    for (w, n), low, high in zip(expected, series["95% low"], series["95% high"], strict=True):
        assert (low, high) == pytest.approx(wilson_interval(w, n))
        assert 0.0 <= low <= w / n <= high <= 1.0
    assert series["95% high"][0] == pytest.approx(0.7935, abs=1e-4)  # 0 of 1: Wilson, not the normal approximation
    episodes = ids["episodes"]
    assert chart["marks"] == [
        {
            "x": 4,
            "label": f"lessons v{ids['v1']}",
            "kind": "lesson_set",
            "version": ids["v1"],
            "episode_id": episodes[3],
        },
        {
            "x": 7,
            "label": "adapter cycle-1",
            "kind": "adapter",
            "adapter_id": ids["adapter"],
            "episode_id": episodes[6],
        },
        {
            "x": 8,
            "label": f"lessons v{ids['v2']}",
            "kind": "lesson_set",
            "version": ids["v2"],
            "episode_id": episodes[7],
        },
    ]
    default = client.get(f"/api/runs/{ids['run']}/learning.json").json()["charts"][0]
    assert default["title"].startswith("rolling success rate (last 20 episodes)")
    assert default["series"][0]["values"] == pytest.approx([w / n for w, n in expected_rolling(20)])


def test_learning_curve_is_sampled_for_long_runs(
    learning_client: tuple[TestClient, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, ids = learning_client
    monkeypatch.setattr(reads, "MAX_POINTS", 4)
    chart = client.get(f"/api/runs/{ids['run']}/learning.json?window=3").json()["charts"][0]
    assert chart["x"] == [3, 6, 9, 10], "every third point (10 / 4 rounded up) and the last"
    expected = expected_rolling(3)
    assert chart["series"][0]["values"] == pytest.approx([expected[x - 1][0] / expected[x - 1][1] for x in chart["x"]])
    assert [m["x"] for m in chart["marks"]] == [4, 7, 8], "marks keep their exact positions"


def test_learning_matrix_and_headline(learning_client: tuple[TestClient, dict[str, Any]]) -> None:
    client, ids = learning_client
    payload = client.get(f"/api/runs/{ids['run']}/learning.json").json()
    matrix = payload["matrix"]
    assert [c["key"] for c in matrix["columns"]] == [  # the known ones in the terminal table's order, then the rest
        "random",
        "teacher_without_lessons",
        "teacher_with_lessons",
        "student_without_lessons",
        "out_of_distribution_probe",
    ]
    assert matrix["columns"][-1]["label"] == "Out-of-distribution probe", "unknown conditions keep their name"
    first, running = matrix["rows"]
    assert (first["cycle_id"], first["status"], first["heldout_kl"]) == (
        ids["cycle"],
        "promoted",
        {"before": 0.8, "after": 0.2},
    )
    assert (running["cycle_id"], running["status"], running["cells"]) == (ids["running_cycle"], "running", {})
    cells = first["cells"]
    low, high = wilson_interval(8, 20)  # 3 of 10 and 5 of 10, pooled over the two environments
    assert cells["teacher_without_lessons"] == pytest.approx({"rate": 0.4, "low": low, "high": high, "n": 20})
    assert cells["teacher_with_lessons"] == pytest.approx({"rate": 0.75, "low": 0.5, "high": 0.9, "n": 20})
    assert cells["random"] == pytest.approx({"rate": 0.1, "low": 0.03, "high": 0.3, "n": 20})
    assert cells["student_without_lessons"]["rate"] == pytest.approx(0.7)
    assert cells["out_of_distribution_probe"]["n"] == 4
    headline = payload["headline"]
    assert headline["cycle_id"] == ids["cycle"], "the newest cycle with evaluations, not the running one"
    assert list(headline["rates"]) == ["base", "with lessons", "consolidated"]
    assert headline["rates"]["consolidated"]["rate"] == pytest.approx(0.7)


def test_learning_page(learning_client: tuple[TestClient, dict[str, Any]]) -> None:
    client, ids = learning_client
    body = client.get(f"/learning?run={ids['run']}&window=7").text
    assert f'data-src="/api/runs/{ids["run"]}/learning.json?window=7"' in body
    assert f'href="/cycles/{ids["cycle"]}">cycle {ids["cycle"]}</a>' in body
    for shown in (
        "base policy, no lessons",
        "consolidated adapter, no lessons",
        ">random admissible action<",
        "Out-of-distribution probe",
        "0.800 → 0.200",
        "40.0%",
        "75.0%",
        "[50.0%, 90.0%] n=20",
        "lessons v1",
        "adapter cycle-1",
        f'href="/episodes/{ids["episodes"][6]}"',
    ):
        assert shown in body, shown
    headline = body.split('class="headline"')[1].split("</section>")[0]
    assert re.findall(r"<b>([^<]+)</b>", headline) == ["40.0%", "75.0%", "70.0%"]
    assert 'href="/learning?run=' in client.get(f"/?run={ids['run']}").text  # linked from the overview
    assert '<a href="/learning?run=' in client.get("/cycles").text  # and from the nav
    empty = client.get(f"/learning?run={ids['run'] + 1}").text
    assert "no OPCD cycles in this run yet" in empty and "no OPCD cycle of this run has been evaluated yet" in empty


def test_episode_page_shows_the_choice_distribution(learning_client: tuple[TestClient, dict[str, Any]]) -> None:
    client, ids = learning_client
    body = client.get(f"/episodes/{ids['choice_episode']}").text
    first, second, third = body.split('class="step"')[1:]
    assert "choice distribution" in first
    chosen = re.search(r'<tr class="on chosen">(.*?)</tr>', first, re.DOTALL).group(1)
    assert "go north" in chosen and "70.0%" in chosen
    assert "20.0%" in first and "10.0%" in first and 'value="0.7' in first
    assert "&lt;b&gt;go south&lt;/b&gt;" in first and ESCAPED in first and XSS not in body
    assert "choice_logprobs holds 2 values for 3 admissible actions" in second
    assert "choice distribution" not in third


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/learning?run=abc", "'run' must be an integer"),
        ("/learning?run=0", "'run' must be at least 1"),
        ("/learning?run=99999999999", "'run' must be at most"),
        ("/learning?window=0", "'window' must be at least 1"),
        ("/learning?window=x", "'window' must be an integer"),
        ("/learning?window=10001", "'window' must be at most"),
        ("/api/runs/1/learning.json?window=-3", "'window' must be at least 1"),
        ("/api/runs/1/success.json?window=soon", "'window' must be an integer"),
        ("/api/runs/abc/learning.json", "path parameter 'run_id' must be an integer, got 'abc'"),
        ("/api/runs/0/learning.json", "'run_id' must be between 1 and"),
        ("/episodes/abc", "path parameter 'episode_id' must be an integer"),
        ("/episodes?adapter=-99999999999999999999", "'adapter' must be at least -2147483648"),
    ],
)
def test_learning_bad_parameters_are_400(
    learning_client: tuple[TestClient, dict[str, Any]], url: str, message: str
) -> None:
    client, _ = learning_client
    response = client.get(url)
    assert response.status_code == 400, response.text[:300]
    text = response.json()["detail"] if url.startswith("/api/") else html.unescape(response.text)
    assert message in text


def test_learning_view_on_postgres(
    learning_client: tuple[TestClient, dict[str, Any]], tmp_path: Path, pg_url: str
) -> None:
    url = pg_url
    ids = seed_learning_store(url, index_dir=tmp_path)
    sqlite_client, sqlite_ids = learning_client
    assert ids["run"] == sqlite_ids["run"] and ids["episodes"] == sqlite_ids["episodes"], "both stores start empty"
    with TestClient(create_app(url), base_url="http://127.0.0.1") as client:
        for query in ("?window=3", "?window=20"):
            path = f"/api/runs/{ids['run']}/learning.json{query}"
            assert client.get(path).json() == sqlite_client.get(path).json(), query
        assert "[50.0%, 90.0%] n=20" in client.get(f"/learning?run={ids['run']}").text


def test_learning_unknown_run_is_404(learning_client: tuple[TestClient, dict[str, Any]]) -> None:
    client, _ = learning_client
    assert client.get("/learning?run=999").status_code == 404
    assert client.get("/api/runs/999/learning.json").json()["detail"].startswith("no run")


def test_learning_view_of_an_empty_store(tmp_path: Path) -> None:
    ExperienceStore.open(tmp_path).close()
    client = TestClient(create_app(tmp_path), base_url="http://127.0.0.1")
    assert "No runs yet" in client.get("/learning").text
    with ExperienceStore.open(tmp_path) as store:
        run = store.create_run("fresh", {})
    chart = client.get(f"/api/runs/{run}/learning.json").json()
    assert chart["charts"][0]["x"] == [] and chart["charts"][0]["note"] == "no episodes yet"
    assert chart["matrix"] == {"columns": [], "rows": []} and chart["headline"] is None


def test_condition_names() -> None:
    assert learning_view.condition_key("Student without-lessons") == "student_without_lessons"
    assert learning_view.condition_label("teacher without lessons") == "base policy, no lessons"
    assert learning_view.condition_label("validation parent", split="train") == "decision (train games): base policy"
    assert learning_view.condition_label("a condition of its own") == "a condition of its own"
