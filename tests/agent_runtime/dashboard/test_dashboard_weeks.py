"""The dashboard after weeks of operation: bad integers are 400s, polled charts and the episode page read
what they show (not every episode or lesson of the run), a stored embedder name cannot make a search
allocate what it likes."""

from __future__ import annotations

import datetime as dt
import html
import random
import re
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, insert
from sqlalchemy.orm import Session

from agent_runtime.dashboard import create_app, reads
from agent_runtime.dashboard.routes import router
from memory import ExperienceStore
from memory.embeddings import MAX_HASH_DIM, make_embedder
from memory.models import Embedding
from memory.testing import DEMO_ENVS, game_episode

HUGE = 2**70
# Every route of the dashboard with the integer query parameters it reads (path parameters are found in
# the route itself); `test_every_route_is_listed` keeps this list complete.
ROUTES = {
    "/": ("run",),
    "/partials/overview": ("run",),
    "/api/runs/{run_id}/success.json": ("window",),
    "/learning": ("run", "window"),
    "/api/runs/{run_id}/learning.json": ("window",),
    "/episodes": ("run", "page", "per_page", "adapter", "lsv"),
    "/episodes/{episode_id}": ("page",),
    "/episodes/{episode_id}/goal": (),
    "/episodes/{episode_id}/error": (),
    "/episodes/{episode_id}/steps/{index}/prompt": (),
    "/episodes/{episode_id}/steps/{index}/observation": (),
    "/episodes/{episode_id}/steps/{index}/response": (),
    "/episodes/{episode_id}/steps/{index}/action": (),
    "/api/episodes/{episode_id}/rewards.json": (),
    "/lessons": ("run", "pool", "page", "per_page"),
    "/lessons/versions": ("run",),
    "/lessons/{lesson_id}": (),
    "/cycles": ("run",),
    "/cycles/{cycle_id}": (),
    "/api/cycles/{cycle_id}/curves.json": (),
    "/search": ("k",),
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, seed_with_xss) -> tuple[TestClient, dict[str, int]]:
    workdir = tmp_path_factory.mktemp("weeks")
    ids = seed_with_xss(workdir)
    with TestClient(create_app(workdir), base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        yield client, ids


def _fill(template: str, ids: dict[str, int], **values: Any) -> str:
    known = {
        "run_id": ids["run"],
        "episode_id": ids["xss_episode"],
        "cycle_id": ids["cycle"],
        "lesson_id": ids["xss_lesson"],
        "index": 0,
        **values,
    }
    return re.sub(r"\{(\w+)\}", lambda m: str(known[m.group(1)]), template)


def test_every_route_is_listed() -> None:
    assert {route.path for route in router.routes} == set(ROUTES)


@pytest.mark.parametrize("value", [HUGE, -HUGE, 2**31, -(2**31) - 1])
@pytest.mark.parametrize("template", sorted(ROUTES))
def test_out_of_range_integers_are_400(demo: tuple[TestClient, dict[str, int]], template: str, value: int) -> None:
    client, ids = demo
    for name in re.findall(r"\{(\w+)\}", template):
        response = client.get(_fill(template, ids, **{name: value}))
        assert response.status_code == 400, (template, name, response.text[:300])
        assert repr(name) in html.unescape(response.text) and str(value) in response.text
    for name in ROUTES[template]:
        url = _fill(template, ids) + f"?q=x&{name}={value}"
        response = client.get(url)
        assert response.status_code == 400, (url, response.text[:300])
        assert repr(name) in html.unescape(response.text)


def test_in_range_integers_still_answer(demo: tuple[TestClient, dict[str, int]]) -> None:
    client, ids = demo
    assert client.get(f"/episodes/{2**31 - 1}").status_code == 404
    assert client.get(f"/episodes/{ids['xss_episode']}/steps/{2**31 - 1}/prompt").status_code == 404
    assert client.get(f"/lessons?pool={-(2**31)}").status_code == 200
    assert client.get(f"/episodes?page={2**31 - 1}").status_code == 200


# -- the polled success chart ------------------------------------------------------------------


def reference_success(rows: list[tuple[str, bool, bool]], window: int) -> tuple[list[int], dict, dict]:
    """The charts' meaning, spelt out over every episode in Python (what the dashboard used to do)."""
    n = len(rows)
    stride = reads.sample_stride(n)
    keep = {i for i in range(n) if i % stride == stride - 1 or i == n - 1}
    xs: list[int] = []
    series: dict[str, dict[str, list]] = {"env": {}, "lessons": {}}
    recent: dict[str, dict[str, deque]] = {"env": {}, "lessons": {}}
    current: dict[str, dict[str, float]] = {"env": {}, "lessons": {}}
    for i, (env_id, won, in_context) in enumerate(rows):
        for kind, key in (("env", env_id), ("lessons", "with lessons" if in_context else "without lessons")):
            last = recent[kind].setdefault(key, deque(maxlen=window))
            last.append(int(won))
            current[kind][key] = sum(last) / len(last)
        if i in keep:
            xs.append(i + 1)
            for kind in ("env", "lessons"):
                for key, rate in current[kind].items():
                    series[kind].setdefault(key, [None] * (len(xs) - 1)).append(rate)
    return xs, series["env"], series["lessons"]


class CountingSession(Session):
    """A session that counts the rows its `execute` results carry into Python."""

    rows = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        frozen = super().execute(*args, **kwargs).freeze()
        CountingSession.rows += len(frozen.data)
        return frozen()


def _many_episodes(store: ExperienceStore, run: int, n: int, seed: int = 0) -> list[tuple[str, bool, bool]]:
    rng = random.Random(seed)
    rows, batch = [], []
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i in range(n):
        env_id = DEMO_ENVS[0] if rng.random() < 0.7 else (DEMO_ENVS[1] if rng.random() < 0.8 else "math/x")
        won, with_lessons = rng.random() < 0.4 + 0.3 * (i / n), rng.random() < i / n
        when = start + dt.timedelta(seconds=i)
        batch.append(
            game_episode(
                env_id, f"t{i}", won=won, n_steps=1, lessons_in_context=[1] if with_lessons else (), ended_at=when
            )
        )
        rows.append((env_id, won, with_lessons))
        if len(batch) == 500:
            store.add_episodes(run, batch)
            batch = []
    if batch:
        store.add_episodes(run, batch)
    return rows


@pytest.mark.slow
def test_success_chart_is_computed_in_sql(memory_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same points as the plain rolling computation, while only about MAX_POINTS rows per series leave
    the database (a run of weeks has a million episodes, and each open tab polls this every 10 s)."""
    n, window = 3000, 7
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "i") as store:
        run = store.create_run("long", {})
        store.add_lesson("a lesson", run_id=run)
        rows = _many_episodes(store, run, n)
        cycles = []
        for at in (1000, 2500):
            cycle = store.start_cycle(run, {})
            cycles.append(cycle)
            with store.engine.begin() as conn:
                from memory.models import Cycle

                when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=at - 1)
                conn.execute(
                    Cycle.__table__.update()
                    .where(Cycle.id == cycle)
                    .values(started_at=when, ended_at=when, status="promoted")
                )
        monkeypatch.setattr(reads, "Session", CountingSession)
        CountingSession.rows = 0
        per_env, lessons = reads.success_charts(store, run, window=window)
    xs, env_series, lesson_series = reference_success(rows, window)
    assert per_env.x == lessons.x == xs and len(xs) <= reads.MAX_POINTS
    for chart, expected in ((per_env, env_series), (lessons, lesson_series)):
        assert set(chart.series) == set(expected)
        for key, values in expected.items():
            assert chart.series[key] == pytest.approx(values), key
    assert [m["x"] for m in per_env.marks] == [1000, 2500]
    assert CountingSession.rows <= len(xs) * 5 + 10, f"{CountingSession.rows} rows read for {len(xs)} points"


# -- the episode page --------------------------------------------------------------------------


class SqliteWork:
    """Counts the SQLite virtual machine's instructions spent on this engine's statements (in hundreds)."""

    def __init__(self, engine: Any) -> None:
        self.steps = 0
        event.listen(engine, "before_cursor_execute", self._attach)

    def _attach(self, conn: Any, *_: Any) -> None:
        conn.connection.dbapi_connection.set_progress_handler(self._tick, 100)

    def _tick(self) -> int:
        self.steps += 1
        return 0


def test_episode_page_reads_only_the_lessons_it_shows(tmp_path: Path) -> None:
    """Finding the lessons an episode produced costs the same with 300 or 3,000 other lessons in the run."""
    with ExperienceStore.open(tmp_path) as store:
        run = store.create_run("r", {})
        episodes = store.add_episodes(
            run, [game_episode(DEMO_ENVS[0], f"t{i}", won=True, n_steps=1) for i in range(60)]
        )
        mine = store.add_lesson("mine", run_id=run, source_episode_ids=[episodes[3], episodes[55]])
        global_lesson = store.add_lesson("no run", source_episode_ids=[episodes[55]])
        store.add_lesson("another run's", run_id=store.create_run("other", {}), source_episode_ids=[episodes[55]])
        target = store.episode(episodes[55])
        work = SqliteWork(store.engine)
        costs = []
        for more in (300, 2700):
            store.record_extraction(
                "x",
                [{"text": f"lesson {i}", "source_episode_ids": [episodes[i % 50]]} for i in range(more)],
                run_id=run,
            )
            work.steps = 0
            found = reads.lessons_from_episode(store, target)
            costs.append(work.steps)
            assert [lesson.id for lesson in found] == [mine, global_lesson]
    assert costs[1] < 2 * costs[0] + 5, f"VM work grew with the run's lessons: {costs}"
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        body = client.get(f"/episodes/{episodes[55]}").text
    assert f'href="/lessons/{mine}"' in body and f'href="/lessons/{global_lesson}"' in body


# -- search with a stored embedder name --------------------------------------------------------


@pytest.mark.parametrize("name", [f"hash-{2**40}", f"hash:{2**40}", "hash-99999999999999999999"])
def test_a_huge_stored_hash_embedder_is_refused(tmp_path: Path, name: str) -> None:
    with ExperienceStore.open(tmp_path) as store:
        run = store.create_run("r", {})
        episode = store.add_episode(run, game_episode(DEMO_ENVS[0], "t", won=True, n_steps=1))
        with store.engine.begin() as conn:
            conn.execute(
                insert(Embedding),
                [{"kind": "episode", "model": name, "item_id": episode, "dim": 4, "vector": b"\0" * 16}],
            )
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        response = client.get("/search?q=coin")
    assert response.status_code == 200
    assert f"from 1 to {MAX_HASH_DIM}" in response.text


def test_hash_embedder_sizes_are_bounded() -> None:
    assert make_embedder(f"hash:{MAX_HASH_DIM}").dim == MAX_HASH_DIM
    for spec in (f"hash:{MAX_HASH_DIM + 1}", "hash:0", "hash:-1", "hash:1e3", "hash:" + "9" * 5000):
        with pytest.raises(ValueError, match=f"from 1 to {MAX_HASH_DIM}"):
            make_embedder(spec)
