"""The experience store's core contract: runs, episodes with steps, stats (on SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from memory import (
    EpisodeRecord,
    ExperienceStore,
    InvalidRecordError,
    NotADatabaseError,
    NotFoundError,
    ReadOnlyStoreError,
    StoreUnavailableError,
)
from memory.testing import make_episode


def test_open_workdir_creates_sqlite_file(tmp_path: Path) -> None:
    with ExperienceStore.open(tmp_path / "work") as opened:
        assert (tmp_path / "work" / "memory.db").is_file()
        assert opened.url.startswith("sqlite")
        assert opened.stats()["episodes"] == 0


def test_run_lifecycle(store: ExperienceStore) -> None:
    run_id = store.create_run("quickstart", {"model": "tiny", "lr": 1e-6})
    run = store.get_run(run_id)
    assert (run.name, run.config, run.phase, run.state, run.status) == (
        "quickstart",
        {"model": "tiny", "lr": 1e-6},
        "PLAY",
        {},
        "running",
    )
    assert run.created_at.tzinfo is not None
    store.update_run(run_id, phase="EXTRACT", state={"episodes": 4}, status="paused")
    after = store.get_run(run_id)
    assert (after.phase, after.state, after.status) == ("EXTRACT", {"episodes": 4}, "paused")
    assert after.updated_at >= run.updated_at
    second = store.create_run("quickstart", {})
    assert store.find_run("quickstart").id == second  # the most recent one
    assert store.find_run("nope") is None
    with pytest.raises(NotFoundError, match="no run with id 999"):
        store.get_run(999)
    with pytest.raises(NotFoundError):
        store.update_run(999, phase="PLAY")


def test_add_episode_round_trips_every_field(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    record = make_episode(4)
    ep_id = store.add_episode(run_id, record, run_state={"episodes": 1})
    got = store.episode(ep_id)
    assert store.get_run(run_id).state == {"episodes": 1}
    assert got.run_id == run_id and got.num_steps == 4
    for name in EpisodeRecord.__dataclass_fields__:
        if name != "steps":
            assert getattr(got, name) == getattr(record, name), name
    assert got.started_at == dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    assert [s.index for s in got.steps] == [0, 1, 2, 3]
    for stored, original in zip(got.steps, record.steps):
        for name in original.__dataclass_fields__:
            assert getattr(stored, name) == getattr(original, name), name
        assert stored.episode_id == ep_id


def test_episode_listing_filters_and_stats(store: ExperienceStore) -> None:
    run_a = store.create_run("a", {})
    run_b = store.create_run("b", {})
    store.add_episode(run_a, make_episode(2, outcome="won"))
    store.add_episode(run_a, make_episode(3, outcome="lost", env_id="toy/maze"))
    store.add_episode(run_b, make_episode(5, outcome="truncated"))
    assert [e.outcome for e in store.episodes(run_a)] == ["lost", "won"]  # newest first
    assert [e.outcome for e in store.episodes(env_id="toy/maze")] == ["lost"]
    assert [e.run_id for e in store.episodes(outcome="truncated")] == [run_b]
    assert len(store.episodes(limit=1, offset=1)) == 1
    assert store.episodes(run_a)[0].steps == []  # listings leave steps out
    assert store.stats() | {"url": None} == {
        "url": None,
        "runs": 2,
        "episodes": 3,
        "steps": 10,
        "lessons": 0,
        "outcomes": {"won": 1, "lost": 1, "truncated": 1},
    }
    assert store.stats(run_a)["steps"] == 5
    assert store.count_episodes(run_a, outcome="won") == 1


def test_invalid_episode_is_rejected_before_writing(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    with pytest.raises(InvalidRecordError, match="unknown episode outcome 'draw'"):
        store.add_episode(run_id, make_episode(outcome="draw"))
    with pytest.raises(NotFoundError):
        store.episode(1)
    assert store.stats()["episodes"] == 0


def test_failed_batch_leaves_nothing(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    bad = make_episode(2)
    bad.adapter_id = 999  # no such adapter: the database's foreign key rejects it
    with pytest.raises(InvalidRecordError, match="violates the schema"):
        store.add_episodes(run_id, [make_episode(2), bad], run_state={"x": 1})
    with pytest.raises(InvalidRecordError):
        store.add_episode(run_id + 100, make_episode(1))
    assert store.stats()["episodes"] == 0 and store.stats()["steps"] == 0
    assert store.get_run(run_id).state == {}


def test_read_only_store_reads_and_the_database_refuses_writes(memory_url: str) -> None:
    with ExperienceStore.open(memory_url) as writer:
        run_id = writer.create_run("r", {})
        writer.add_episode(run_id, make_episode(2))
    with ExperienceStore.open(memory_url, read_only=True) as reader:
        assert reader.stats()["steps"] == 2 and reader.get_run(run_id).name == "r"
        with pytest.raises(ReadOnlyStoreError, match="opened read-only"):
            reader.create_run("x", {})
        # the database itself refuses, not only our check
        with pytest.raises(DBAPIError), reader.engine.begin() as conn:
            conn.execute(text("UPDATE runs SET name = 'hacked'"))
    with ExperienceStore.open(memory_url) as again:
        assert again.get_run(run_id).name == "r"


def test_read_only_open_of_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError, match="no memory database at"):
        ExperienceStore.open(tmp_path / "nothing", read_only=True)
    assert not (tmp_path / "nothing").exists()


def test_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(StoreUnavailableError, match="cannot open the memory at postgresql") as err:
        ExperienceStore.open("postgresql+psycopg://u:secret@127.0.0.1:1/none")
    assert "secret" not in str(err.value)
    with pytest.raises(StoreUnavailableError, match="unsupported database backend 'mysql'"):
        ExperienceStore.open("mysql://u@localhost/db")


def test_unstorable_values_are_a_clear_error(store: ExperienceStore) -> None:
    run_id = store.create_run("r", {})
    record = make_episode(2)
    record.metadata = {"when": object()}  # not JSON
    with pytest.raises(InvalidRecordError, match="cannot be stored as JSON.*not JSON serializable"):
        store.add_episode(run_id, record)
    assert store.stats()["episodes"] == 0
    record.metadata = {"loss": float("nan"), "curve": [1.0, float("inf")]}
    stored = store.episode(store.add_episode(run_id, record))
    assert stored.metadata == {"loss": None, "curve": [1.0, None]}  # the same on both backends


def test_an_existing_file_of_any_name_is_taken_as_the_database(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    with pytest.raises(NotADatabaseError, match="notes.txt is not an SQLite database"):
        ExperienceStore.open(notes)
    assert notes.read_text() == "my notes"
