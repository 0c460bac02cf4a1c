"""`memory prune`: a run's old episodes go, with their steps, vectors and unused prompt parts; what a live
lesson came from or an adapter was trained on stays; the FAISS indexes stay consistent."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from memory import ExperienceStore, InvalidRecordError
from memory.embeddings import HashEmbedder
from memory.index import VectorIndex, index_paths
from memory.models import Embedding, PromptPart, Step
from memory.testing import game_episode

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _seed(store: ExperienceStore) -> dict[str, list[int] | int]:
    """Run `run` of 30 episodes, one a day (the newest ends at NOW), each with its own lessons text in its
    first prompt (so its own prompt part); live and retired lessons and cycles that point at some of them;
    then an older-looking episode of another run, which is the store's newest row."""
    run = store.create_run("month", {})
    records = []
    for day in range(30):
        record = game_episode(
            "textworld/coin_collector",
            f"t{day}",
            won=day % 2 == 0,
            n_steps=3,
            ended_at=NOW - dt.timedelta(days=29 - day),
        )
        for step in record.steps:
            step.prompt = f"system: play well. Lessons of day {day}: look twice, then act.\n{step.observation}"
        records.append(record)
    ids = store.add_episodes(run, records)
    store.add_lesson("live", run_id=run, status="active", source_episode_ids=[ids[2], ids[3]])
    store.add_lesson("retired", run_id=run, status="retired", source_episode_ids=[ids[4]])
    for status, trained in (("promoted", [ids[5], ids[6]]), ("rolled_back", [ids[7]]), ("running", [ids[8]])):
        cycle = store.start_cycle(run, {}, episode_ids=trained)
        if status != "running":
            store.update_cycle(cycle, status=status)
    other = store.create_run("other", {})
    elsewhere = store.add_episode(
        other, game_episode("x/y", "far", won=True, n_steps=1, ended_at=NOW - dt.timedelta(days=90))
    )
    store.reindex()
    return {"run": run, "ids": ids, "other": other, "elsewhere": elsewhere}


def _sql_ids(store: ExperienceStore) -> list[int]:
    with store.engine.connect() as conn:
        return sorted(conn.scalars(select(Embedding.item_id).where(Embedding.kind == "episode")))


def test_prune_keeps_what_provenance_needs(memory_url: str, tmp_path: Path) -> None:
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "index", embedder=HashEmbedder(32)) as store:
        seeded = _seed(store)
        run, ids = seeded["run"], seeded["ids"]
        plan = store.prune_plan(run, keep_last=10)
        protected = {ids[2], ids[3], ids[5], ids[6], ids[8]}  # live lesson, promoted and running cycles
        assert plan.episode_ids == [i for i in ids[:20] if i not in protected]
        assert (plan.kept_recent, plan.kept_for_lessons, plan.kept_for_adapters) == (10, 2, 3)
        assert plan.steps == 3 * len(plan.episode_ids) and plan.oldest == NOW - dt.timedelta(days=29)
        assert store.count_episodes(run) == 30, "a plan deletes nothing"

        with store.engine.connect() as conn:
            parts_before = conn.scalar(select(func.count()).select_from(PromptPart))
        done = store.prune(plan)
        assert done.episode_ids == plan.episode_ids
        left = {e.id for e in store.episodes(run, limit=100)}
        assert left == set(ids) - set(plan.episode_ids)
        assert store.count_episodes(seeded["other"]) == 1
        with store.engine.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(Step).where(Step.episode_id.in_(plan.episode_ids))) == 0
            parts_after = conn.scalar(select(func.count()).select_from(PromptPart))
        assert parts_after == parts_before - len(plan.episode_ids), "the deleted episodes' own parts went too"
        for kept in sorted(left):
            assert store.episode(kept).steps[2].prompt.startswith("system: play well.")

        # the vectors and the index agree with what is left, in this process and in a new one
        assert _sql_ids(store) == sorted(left | {seeded["elsewhere"]})
        hits = store.search_episodes("coin", k=40)
        assert {h.id for h in hits} <= left | {seeded["elsewhere"]} and len(hits) == len(left) + 1
        path, sidecar = index_paths(tmp_path / "index", "episode", "hash-32")
        index, _ = VectorIndex.load(path, sidecar)
        assert sorted(index.ids().tolist()) == _sql_ids(store)
        store.vacuum()  # SQLite VACUUM / PostgreSQL VACUUM ANALYZE, outside any transaction
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "index", embedder=HashEmbedder(32)) as again:
        again.search_episodes("coin", k=3)
        assert again.last_index_sync["episode"] == "loaded", "the file on disk matched SQL"
        # an export of the pruned store imports: the retired lesson still names its pruned episode
        text = io.StringIO()
        again.export_jsonl(text)
    with ExperienceStore.open(tmp_path / "copy") as copy:
        copy.import_jsonl(io.StringIO(text.getvalue()))
        assert copy.lessons(run, status="retired")[0].source_episode_ids == [ids[4]]


def test_prune_by_age_and_by_both(store: ExperienceStore) -> None:
    seeded = _seed(store)
    run, ids = seeded["run"], seeded["ids"]
    by_age = store.prune_plan(run, days=7.5, now=NOW)  # keeps the episodes of the last 7.5 days: 8 of them
    assert by_age.kept_recent == 8 and by_age.episode_ids[-1] == ids[21]
    both = store.prune_plan(run, keep_last=15, days=7.5, now=NOW)  # either keeps: the larger window wins
    assert both.kept_recent == 15 and both.episode_ids[-1] == ids[14]
    assert store.prune_plan(run, keep_last=100).episode_ids == []
    nothing_old = store.prune_plan(run, days=365, now=NOW)
    assert nothing_old.episode_ids == [] and nothing_old.kept_recent == 30


def test_the_newest_episode_of_the_store_is_never_deleted(store: ExperienceStore) -> None:
    run = store.create_run("r", {})
    ids = store.add_episodes(
        run, [game_episode("x/y", f"t{i}", won=True, n_steps=1, ended_at=NOW - dt.timedelta(days=50)) for i in range(3)]
    )
    plan = store.prune_plan(run, days=1, now=NOW)
    assert plan.episode_ids == ids[:2] and plan.kept_newest == 1


@pytest.mark.parametrize(
    ("keep_last", "days", "message"),
    [
        (None, None, "say what to keep"),
        (-1, None, "0 or more"),
        (True, None, "0 or more"),
        (None, -2.0, "0 or more"),
        (None, float("nan"), "0 or more"),
        (None, float("inf"), "0 or more"),
    ],
)
def test_prune_refuses_unclear_windows(store: ExperienceStore, keep_last, days, message: str) -> None:
    run = store.create_run("r", {})
    with pytest.raises(InvalidRecordError, match=message):
        store.prune_plan(run, keep_last=keep_last, days=days)


def test_prune_command_is_a_dry_run_without_yes(tmp_path: Path, cli) -> None:
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(32)) as store:
        seeded = _seed(store)
    dry = cli("memory", "prune", "--workdir", tmp_path, "--run", seeded["run"], "--keep", "10").stdout
    assert "would delete 15 of 30 episodes (45 steps)" in dry and "add --yes to delete them" in dry
    assert "kept: 10 recent, 2 a live lesson came from, 3 in an adapter's training set" in dry
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        assert store.count_episodes(seeded["run"]) == 30
    done = json.loads(
        cli("memory", "prune", "--workdir", tmp_path, "--run", seeded["run"], "--keep", "10", "--yes", "--json").stdout
    )
    assert done["deleted"] and len(done["episode_ids"]) == 15
    with ExperienceStore.open(tmp_path, read_only=True) as store:
        assert store.count_episodes(seeded["run"]) == 15
    again = cli("memory", "prune", "--workdir", tmp_path, "--run", seeded["run"], "--keep", "10").stdout
    assert "nothing to prune of its 15 episodes" in again
    unclear = cli("memory", "prune", "--workdir", tmp_path, "--keep", "1", check=False)
    assert unclear.returncode == 2 and "which run? pass --run ID" in unclear.stderr
    assert "say what to keep" in cli("memory", "prune", "--workdir", tmp_path, "--run", "1", check=False).stderr
    before = (tmp_path / "memory.db").stat().st_size
    cli("memory", "vacuum", "--workdir", tmp_path)
    assert (tmp_path / "memory.db").stat().st_size < before


def test_vectors_of_a_pruned_store_match_its_index_file(tmp_path: Path) -> None:
    """The saved index is rebuilt from SQL: no id of a deleted episode survives in it."""
    with ExperienceStore.open(tmp_path, embedder=HashEmbedder(32)) as store:
        seeded = _seed(store)
        store.prune(store.prune_plan(seeded["run"], keep_last=0))
        path, sidecar = index_paths(tmp_path / "index", "episode", "hash-32")
        index, meta = VectorIndex.load(path, sidecar)
        assert meta["count"] == index.count == len(_sql_ids(store))
        assert np.isin(index.ids(), np.asarray(seeded["ids"][:20])).sum() == len(
            {seeded["ids"][i] for i in (2, 3, 5, 6, 8)}
        )
