"""Environment text has a size cap: an environment that answers with 8 MB observations writes a small
store (each stored text at most the cap plus a visible marker, the cut recorded in the step's info), the model is
prompted with the cut text, admissible actions over the action cap are not offered, and the dashboard's episode page
stays small: a page of steps at a time, each text block cut with a link to the whole stored text."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from agent_runtime.config import config_from_dict
from agent_runtime.dashboard import create_app
from agent_runtime.dashboard.routes import SHOWN_CHARS, STEPS_PER_PAGE
from agent_runtime.evaluation import evaluate
from agent_runtime.llm.scripted import ScriptedBackend
from environments.base import MAX_ACTION_CHARS, MAX_OBSERVATION_CHARS, EnvSpec
from environments.checker import env_failures
from environments.episodic import EpisodicEnv, IndexedTasks
from memory import EpisodeRecord, ExperienceStore
from memory.testing import make_episode

HUGE = f"{__name__}:HugeEnv"
EIGHT_MB = 8 * 2**20
MARKER = f"… [truncated: {EIGHT_MB:,} characters, kept {MAX_OBSERVATION_CHARS:,}]"
LONG_ACTION = "say " + "a" * (MAX_ACTION_CHARS + 10)


class HugeEnv(EpisodicEnv):
    """Every observation and the goal are 8 MB; one admissible action is longer than the action cap."""

    def __init__(self, *, cache_dir: str | None = None, max_steps: int | None = None) -> None:
        super().__init__(EnvSpec(id="tests/huge", max_steps=3, family="text"), max_steps=max_steps)

    def _tasks(self, split: str) -> Sequence[str]:
        return IndexedTasks(split, 4)

    def _info(self) -> dict[str, Any]:
        return {"admissible_actions": ["wait", LONG_ACTION], "goal": "G" * EIGHT_MB, "won": False}

    def _reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        return "R" * EIGHT_MB, self._info()

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        return "S" * EIGHT_MB, 0.0, False, self._info()


class PromptSizes(ScriptedBackend):
    """A scripted policy that notes the longest chat it was given, in characters."""

    longest = 0

    def choose(self, prompts, choices, params):
        PromptSizes.longest = max(PromptSizes.longest, *(sum(len(m["content"]) for m in chat) for chat in prompts))
        assert all(len(a) <= MAX_ACTION_CHARS for options in choices for a in options)
        return super().choose(prompts, choices, params)


def huge_episodes(workdir: Path) -> list[EpisodeRecord]:
    config = config_from_dict(
        {
            "name": "huge",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [{"id": HUGE}],
            "runtime": {"slots": 2},
            "evaluation": {"episodes_per_env": 2},
        }
    )
    records: list[EpisodeRecord] = []
    evaluate(config, workdir, PromptSizes(), reuse=False, on_record=records.append)
    return records


def test_huge_observations_are_cut_before_the_prompt_and_the_store(tmp_path):
    PromptSizes.longest = 0
    records = huge_episodes(tmp_path)
    assert [len(r.steps) for r in records] == [3, 3]
    # the prompt holds the cut observations of the turns it shows (the system part and lessons are small)
    assert 0 < PromptSizes.longest < 10 * (MAX_OBSERVATION_CHARS + len(MARKER))
    with ExperienceStore.open(tmp_path, embedder="hash") as store:
        run_id = store.create_run("huge", {})
        ids = [store.add_episode(run_id, record) for record in records]
        for episode_id in ids:
            episode = store.episode(episode_id)
            assert episode.goal == "G" * MAX_OBSERVATION_CHARS + MARKER
            assert episode.metadata["final_observation"] == "S" * MAX_OBSERVATION_CHARS + MARKER
            assert episode.metadata["final_observation_chars"] == EIGHT_MB
            for step in episode.steps:
                assert len(step.observation) <= MAX_OBSERVATION_CHARS + len(MARKER)
                assert step.observation.endswith(MARKER) and step.info["observation_chars"] == EIGHT_MB
                assert step.admissible_actions == ["wait"] and step.info["admissible_dropped"] == 1
                assert len(step.prompt) < 10 * (MAX_OBSERVATION_CHARS + len(MARKER))
    size = sum(f.stat().st_size for f in tmp_path.rglob("memory.db*"))
    assert size < 2 * 2**20, f"the store holds {size:,} bytes for 2 episodes of 3 steps"


def test_check_env_reports_an_action_the_runtime_would_not_offer():
    failures = env_failures(HugeEnv())
    assert any(f"an action of {len(LONG_ACTION):,} characters" in f for f in failures), failures


def test_the_episode_page_of_huge_observations_is_small(tmp_path):
    records = huge_episodes(tmp_path)
    with ExperienceStore.open(tmp_path, embedder="hash") as store:
        episode_id = store.add_episode(store.create_run("huge", {}), records[0])
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        page = client.get(f"/episodes/{episode_id}")
        assert page.status_code == 200 and len(page.content) < 100_000
        full = client.get(f"/episodes/{episode_id}/steps/0/observation")
        assert full.status_code == 200 and "R" * MAX_OBSERVATION_CHARS + html.escape(MARKER) in full.text


def long_episode(n_steps: int, chars: int) -> EpisodeRecord:
    """An episode stored with long texts (an import, or a store written before the cap): steps of `chars`
    characters of observation and response, each step's text marked by its index."""
    record = make_episode(n_steps)
    for step in record.steps:
        step.observation = f"<obs {step.index}>" + "o" * chars + "<script>x</script>"
        step.response = f"<resp {step.index}>" + "r" * chars
    record.goal = "g" * chars
    return record


def step_ids(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<article class="step" id="step-(\d+)"', page)]


def test_a_long_episode_is_paged_and_its_texts_cut(tmp_path):
    n_steps = STEPS_PER_PAGE * 2 + 5
    with ExperienceStore.open(tmp_path, embedder="hash") as store:
        episode_id = store.add_episode(store.create_run("long", {}), long_episode(n_steps, 100_000))
    with TestClient(create_app(tmp_path), base_url="http://127.0.0.1") as client:
        first = client.get(f"/episodes/{episode_id}").text
        assert step_ids(first) == list(range(STEPS_PER_PAGE))
        assert len(first.encode()) < STEPS_PER_PAGE * 3 * SHOWN_CHARS + 50_000
        assert f'href="/episodes/{episode_id}?page=2"' in first and "?page=0" not in first
        assert f"/episodes/{episode_id}/steps/0/observation" in first  # the whole text, on its own page
        last = client.get(f"/episodes/{episode_id}?page=3").text
        assert step_ids(last) == list(range(2 * STEPS_PER_PAGE, n_steps))
        assert f'href="/episodes/{episode_id}?page=2"' in last and "?page=4" not in last
        assert "<script>x" not in last  # escaping holds where the cut keeps the end of a text out of view
        whole = client.get(f"/episodes/{episode_id}/steps/{n_steps - 1}/observation")
        assert whole.status_code == 200 and "o" * 100_000 + "&lt;script&gt;x&lt;/script&gt;" in whole.text
        assert "<script>x" not in whole.text
        response = client.get(f"/episodes/{episode_id}/steps/3/response").text
        assert "r" * 100_000 in response and f"/episodes/{episode_id}?page=1#step-3" in response
        goal = client.get(f"/episodes/{episode_id}/goal")
        assert goal.status_code == 200 and "g" * 100_000 in goal.text
        beyond = client.get(f"/episodes/{episode_id}?page=4")
        assert beyond.status_code == 404 and "3 page" in beyond.text
        assert client.get(f"/episodes/{episode_id}/steps/{n_steps}/observation").status_code == 404
        chart = client.get(f"/api/episodes/{episode_id}/rewards.json").json()
        assert chart["charts"][0]["x"] == list(range(n_steps))
