"""Fixtures for the memory tests: a fresh store on SQLite and on PostgreSQL (parametrized).

Test modules import the fixtures they use by name (`from tests.fixtures_memory import store`), so
they work whether or not the suite's conftest registers this module as a plugin.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory import EpisodeRecord, ExperienceStore, StepRecord
from memory.embeddings import HashEmbedder
from tests.pg import require_pg, reset_pg


@pytest.fixture(params=["sqlite", "postgres"])
def memory_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a workdir on SQLite, or the reset test database on PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "work")
    url = require_pg()
    reset_pg(url)
    return url


@pytest.fixture
def store(memory_url: str, tmp_path: Path) -> Iterator[ExperienceStore]:
    """A freshly migrated store with a cheap deterministic embedder."""
    opened = ExperienceStore.open(
        memory_url, index_dir=tmp_path / "index", embedder=HashEmbedder(dim=32)
    )
    yield opened
    opened.close()


def make_episode(
    n_steps: int = 3,
    *,
    env_id: str = "toy/corridor",
    task_id: str = "task-0",
    outcome: str = "won",
    goal: str | None = "reach the end of the corridor",
    lessons: list[int] | None = None,
    seed: int | None = 7,
) -> EpisodeRecord:
    """A small but fully populated episode record (every field non-default)."""
    start = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    steps = [
        StepRecord(
            index=i,
            observation=f"You are in room {i} of {task_id}. Exits: north, south.",
            prompt=f"<system>play</system>\n<obs>room {i}</obs>",
            response=f"I go north ({i})",
            action="go north" if i % 2 == 0 else None,
            valid_action=i % 2 == 0,
            reward=0.5 * i,
            admissible_actions=["go north", "go south"] if i % 2 == 0 else None,
            prompt_tokens=100 + i,
            completion_tokens=10 + i,
            latency_s=0.25 * i,
            info={"score": i, "nested": {"k": [1, 2.5, "x"]}},
        )
        for i in range(n_steps)
    ]
    return EpisodeRecord(
        env_id=env_id,
        task_id=task_id,
        seed=seed,
        policy="smollm2-135m-instruct",
        adapter_id=None,
        lesson_set_version=None,
        outcome=outcome,
        won=outcome == "won",
        total_return=sum(s.reward for s in steps),
        prompt_tokens=sum(s.prompt_tokens for s in steps),
        completion_tokens=sum(s.completion_tokens for s in steps),
        started_at=start,
        ended_at=start + dt.timedelta(seconds=12.5),
        error="boom" if outcome == "error" else None,
        goal=goal,
        lessons_in_context=lessons or [],
        metadata={"temperature": 0.7, "tags": ["a", "b"]},
        steps=steps,
    )
