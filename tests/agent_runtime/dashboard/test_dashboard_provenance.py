"""The dashboard shows provenance to the end: a lesson page with the lesson's whole life, an
episode page with the fingerprint of the weights that acted, a cycle page with the adapter probe's verdicts.

The store is written through the ExperienceStore API (and `distill.lessons.forget`, as `lessons forget` writes
it) into a temporary SQLite file and opened read-only by the app, as in tests/agent_runtime/dashboard/test_dashboard.py. Texts a model or
a person wrote carry a script payload: shown, never run.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agent_runtime.dashboard import create_app
from distill.lessons.forget import apply_forget, plan_forget
from distill.lessons.versions import create_version
from memory import EVALUATION_LESSON_UTILITY, ExperienceStore
from memory.testing import DEMO_ENVS, game_episode

XSS = "<script>alert(1)</script>"
ESCAPED = html.escape(XSS, quote=False)
TRAINED = "a" * 64  # the fingerprint of the files the trainer wrote
OTHER = "b" * 64


def _history(workdir: Path) -> dict[str, int]:
    """A lesson extracted from two episodes, held by v1 and v2, taught into cycle 1 (promoted, consolidating it)
    and cycle 2 (rolled back), then forgotten, which rolls the run back to the base model; a person's lesson; two
    episodes played with cycle 1's adapter, one with the trainer's weights and one with other weights."""
    with ExperienceStore.open(workdir) as store:
        run = store.create_run("life", {"name": "life"})
        sources = [store.add_episode(run, game_episode(DEMO_ENVS[0], f"t{i}", won=i == 0, seed=i)) for i in (0, 1)]
        _, [lesson] = store.record_extraction(
            "extractor", [f"Take the coin {XSS} at once."], run_id=run, episode_ids=sources, prompt="p", response="r"
        )
        user = store.add_lesson(f"Look first {XSS}.", run_id=run, metadata={"source": "user"})
        v1 = create_version(store, run, [lesson]).version
        measured = store.add_evaluation(
            "*",
            run_id=run,
            kind=EVALUATION_LESSON_UTILITY,
            metrics={
                "utilities": {
                    str(lesson): {"utility": 0.25, "rate_with": 0.75, "rate_without": 0.5, "n_with": 8, "n_without": 6}
                }
            },
        )
        v2 = create_version(store, run, [lesson, user], by_user=True, note=f"a person added {XSS}").version
        cycle1 = store.start_cycle(run, {}, lesson_set_version=v1)
        adapter1 = store.add_adapter("cycle-1", "/adapters/cycle-1", run_id=run, fingerprint=TRAINED)
        store.update_cycle(
            cycle1,
            adapter_id=adapter1,
            metrics={
                "probe": {
                    "results": {
                        "the loop's transformers backend": {
                            "verdict": "adapter",
                            "mode": "choice",
                            "prompts": 4,
                            "to_adapter": 0.0012,
                            "to_parent": 0.71,
                            "shift": 0.71,
                            "tolerance": 0.01,
                            "note": "",
                        },
                        "rollout worker 1 (vllm backend)": {
                            "verdict": "stale",
                            "mode": "choice",
                            "prompts": 4,
                            "to_adapter": 0.7,
                            "to_parent": 0.002,
                            "shift": 0.71,
                            "tolerance": 0.15,
                            "note": XSS,
                        },
                    }
                }
            },
        )
        store.promote_cycle(cycle1, [lesson])
        cycle2 = store.start_cycle(run, {}, lesson_set_version=v2, base_adapter_id=adapter1)
        adapter2 = store.add_adapter("cycle-2", "/adapters/cycle-2", run_id=run, parent_id=adapter1)
        store.update_cycle(cycle2, adapter_id=adapter2)
        store.rollback_cycle(cycle2, error="did not help")
        played = {}
        for name, fingerprint in (("match", TRAINED), ("mismatch", OTHER)):
            record = game_episode(DEMO_ENVS[0], f"played-{name}", won=True, seed=7)
            record.adapter_id, record.adapter_fingerprint = adapter1, fingerprint
            played[name] = store.add_episode(run, record)
        base = store.add_episode(run, game_episode(DEMO_ENVS[0], "base", won=False, seed=8))
        unreported = game_episode(DEMO_ENVS[0], "unreported", won=False, seed=9)
        unreported.adapter_id = adapter1
        played["unreported"] = store.add_episode(run, unreported)
        done = apply_forget(store, plan_forget(store, lesson), count_tokens=lambda text: len(text.split()))
        # the next EXTRACT measures only what can still enter a context: the person's lesson, not the forgotten one
        newest = store.add_evaluation(
            "*",
            run_id=run,
            kind=EVALUATION_LESSON_UTILITY,
            metrics={
                "utilities": {
                    str(user): {
                        "utility": None,
                        "rate_with": 1.0,
                        "rate_without": 0.5,
                        "n_with": 1,
                        "n_without": 4,
                        "min_episodes": 3,
                    }
                }
            },
        )
    return {
        "run": run,
        "lesson": lesson,
        "user": user,
        "cycle1": cycle1,
        "cycle2": cycle2,
        "adapter1": adapter1,
        "adapter2": adapter2,
        "v1": v1,
        "v2": v2,
        "forget_version": done["versions"][0],
        "request": done["request_id"],
        "base": base,
        **{f"episode_{k}": v for k, v in played.items()},
        "source0": sources[0],
        "measured": measured,
        "newest_measured": newest,
    }


@pytest.fixture(scope="module")
def life(tmp_path_factory) -> tuple[TestClient, dict[str, int]]:
    workdir = tmp_path_factory.mktemp("life")
    ids = _history(workdir)
    with TestClient(create_app(workdir), base_url="http://127.0.0.1") as client:
        yield client, ids


def _section(body: str, css_class: str) -> str:
    match = re.search(rf'<section class="{css_class}">(.*?)</section>', body, re.DOTALL)
    assert match, f"no section {css_class}"
    return match.group(1)


def test_the_lesson_page_shows_its_whole_life(life) -> None:
    client, ids = life
    body = client.get(f"/lessons/{ids['lesson']}").text
    assert '<span class="badge forgotten">forgotten</span>' in body and XSS not in body and ESCAPED in body
    origin = re.search(r'<dd class="origin">(.*?)</dd>', body, re.DOTALL).group(1)
    assert f'href="/episodes/{ids["source0"]}"' in origin and "through extraction" in origin
    held = _section(body, "held")
    assert [int(v) for v in re.findall(r">v(\d+)</a>", held)] == [ids["v1"], ids["v2"]], "the versions that held it"
    assert "a person" in held and f"a person added {ESCAPED}" in held
    taught = _section(body, "taught")
    rows = taught.split("<tr>")[2:]
    assert len(rows) == 2, "both cycles were taught with it, the rolled-back one too"
    assert f'href="/cycles/{ids["cycle1"]}"' in rows[0] and "cycle-1 (#" in rows[0] and "<td>yes</td>" in rows[0]
    assert f'href="/cycles/{ids["cycle2"]}"' in rows[1] and "rolled_back" in rows[1] and "<td>no</td>" in rows[1]
    forgotten = _section(body, "forgotten")
    assert f"v{ids['forget_version']}" in forgotten, "the version the forget wrote"
    assert "cycle-1 (#" in forgotten and "cycle-2 (#" in forgotten, "the adapters it tainted"
    assert "the run went back to the base model" in forgotten
    assert f"run request #{ids['request']}, pending" in forgotten
    events = [re.sub(r"<[^>]+>", "", e) for e in re.findall(r"<li>(.*?)</li>", _section(body, "life"), re.DOTALL)]
    kinds = [
        next(k for k in ("extracted", "in lesson set", "taught into", "consolidated by", "forgotten") if k in e)
        for e in events
    ]
    assert kinds[0] == "extracted" and kinds[-1] == "forgotten" and "consolidated by" in kinds
    assert kinds.count("in lesson set") == 2 and kinds.count("taught into") == 2


def _measured(body: str) -> str:
    return re.search(r'<dd class="measured">(.*?)</dd>', body, re.DOTALL).group(1)


def test_a_forgotten_lesson_keeps_its_last_measured_utility(life) -> None:
    """The newest utility snapshot no longer measures the consolidated, then forgotten, lesson (EXTRACT measures
    what can still enter a context): its page shows the snapshot that last did, and when; the person's lesson
    shows the newest, where it had too few episodes to tell."""
    client, ids = life
    store = client.app.state.store
    older, newest = store.get_evaluation(ids["measured"]), store.get_evaluation(ids["newest_measured"])
    shown = _measured(client.get(f"/lessons/{ids['lesson']}").text)
    assert "+25.0 points (75.0% with it over 8 episodes, 50.0% without over 6)" in shown
    assert (
        f"measured {older.created_at.strftime('%Y-%m-%d %H:%M:%S')} UTC (lesson-utility snapshot {older.id})" in shown
    )
    assert "this is its last measurement" in shown
    user = _measured(client.get(f"/lessons/{ids['user']}").text)
    assert "too few episodes to tell (1 with it, 4 without; 3 each needed)" in user
    assert f"lesson-utility snapshot {newest.id})" in user and "last measurement" not in user
    listed = client.get(f"/lessons?run={ids['run']}").text
    row = next(r for r in listed.split("<tr>") if f'href="/lessons/{ids["lesson"]}"' in r)
    assert "+25.0 pts" in row, "the list shows the last measurement too"


def test_latest_lesson_utilities_finds_each_lessons_newest_measurement(store) -> None:
    """On SQLite and PostgreSQL: the newest snapshot holding each lesson's entry (snapshots of another kind or run
    and lessons never measured are left out), found past more lessons than one query looks up."""
    from memory.evaluation_store import UTILITY_IDS_PER_QUERY

    run, other = store.create_run("r", {}), store.create_run("other", {})
    many = range(1000, 1000 + UTILITY_IDS_PER_QUERY + 5)
    first = store.add_evaluation(
        "*",
        run_id=run,
        kind=EVALUATION_LESSON_UTILITY,
        metrics={"utilities": {"1": {"utility": 0.1}, "2": {"utility": 0.2}, **{str(i): {"utility": i} for i in many}}},
    )
    second = store.add_evaluation(
        "*", run_id=run, kind=EVALUATION_LESSON_UTILITY, metrics={"utilities": {"2": {"utility": None, "n_with": 1}}}
    )
    store.add_evaluation("*", run_id=run, split="lesson-utility", metrics={"utilities": {"1": {"utility": -1}}})
    store.add_evaluation(
        "*", run_id=other, kind=EVALUATION_LESSON_UTILITY, metrics={"utilities": {"1": {"utility": 9}}}
    )
    found = store.latest_lesson_utilities(run, [1, 2, 3, *many])
    assert (found[1].evaluation_id, found[1].entry) == (first, {"utility": 0.1})
    assert (found[2].evaluation_id, found[2].entry) == (second, {"utility": None, "n_with": 1})
    assert 3 not in found and all(found[i].entry == {"utility": i} for i in many)
    assert found[1].measured_at == store.get_evaluation(first).created_at
    assert store.latest_lesson_utilities(run, []) == {}


def test_the_life_of_a_persons_lesson_that_never_reached_a_cycle(life) -> None:
    client, ids = life
    body = client.get(f"/lessons/{ids['user']}").text
    origin = re.search(r'<dd class="origin">(.*?)</dd>', body, re.DOTALL).group(1)
    assert "a person" in origin and "/episodes/" not in origin
    assert "no OPCD cycle was taught with it" not in body, "cycle 2's set held it"
    assert '<span class="badge forgotten">' not in body and '<section class="forgotten">' not in body


def test_a_done_reconsolidation_shows_its_outcome(tmp_path: Path) -> None:
    ids = _history(tmp_path)
    with ExperienceStore.open(tmp_path) as store:
        store.finish_request(ids["request"], {"cycle_id": 99, "status": "promoted"})
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        forgotten = _section(client.get(f"/lessons/{ids['lesson']}").text, "forgotten")
    assert f"run request #{ids['request']}, done" in forgotten and "promoted" in forgotten


def test_the_episode_page_shows_the_weights_and_flags_a_mismatch(life) -> None:
    client, ids = life
    same = client.get(f"/episodes/{ids['episode_match']}").text
    weights = re.search(r'<dd class="fingerprint">(.*?)</dd>', same, re.DOTALL).group(1)
    assert TRAINED[:16] in weights and "the trainer's weights" in weights and "mismatch" not in weights
    assert "cycle-1 (#" in same
    other = client.get(f"/episodes/{ids['episode_mismatch']}").text
    weights = re.search(r'<dd class="fingerprint">(.*?)</dd>', other, re.DOTALL).group(1)
    assert '<span class="badge mismatch">mismatch</span>' in weights and OTHER[:16] in weights
    assert TRAINED[:16] in weights, "it names what the trainer wrote"
    base = re.search(r'<dd class="fingerprint">(.*?)</dd>', client.get(f"/episodes/{ids['base']}").text, re.DOTALL)
    assert "base model" in base.group(1)
    unreported = client.get(f"/episodes/{ids['episode_unreported']}").text
    assert "no fingerprint reported by the backend" in unreported


def test_the_cycle_page_shows_the_probe(life) -> None:
    client, ids = life
    probe = _section(client.get(f"/cycles/{ids['cycle1']}").text, "probe")
    rows = probe.split("<tr>")[2:]
    assert "rollout worker 1 (vllm backend)" in rows[0] and '<span class="badge mismatch">stale</span>' in rows[0]
    assert "0.7000" in rows[0] and ESCAPED in rows[0] and XSS not in probe
    assert "the loop&#39;s transformers backend" in rows[1] and '<span class="badge match">adapter</span>' in rows[1]
    assert "no acting backend was probed" in client.get(f"/cycles/{ids['cycle2']}").text


def test_pages_of_a_lesson_without_history_render(tmp_path: Path) -> None:
    with ExperienceStore.open(tmp_path) as store:
        lonely = store.add_lesson("Nothing happened to me.")
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        body = client.get(f"/lessons/{lonely}").text
    assert "no version held it" in body and "no OPCD cycle was taught with it" in body
    assert re.search(r'<dd class="origin">\s*not recorded', body)
    assert dt.datetime.now(dt.UTC).strftime("%Y-%m-%d") in _section(body, "life")
