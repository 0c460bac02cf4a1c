"""Benchmark of the experience memory: inserts, retrieval, reindex, disk use. Prints markdown tables.

What it measures (targets in brackets):
1. insert throughput in steps/s on SQLite [>= 5,000] and PostgreSQL, one transaction per episode
   (`add_episode`, what the loop does) and per batch of 50 episodes (`add_episodes`); episodes have
   20 steps with realistic text sizes (observation ~300 B, rendered prompt ~1.5 KB, response ~120 B);
2. bytes per step on disk (SQLite file after a WAL checkpoint, indexes included);
3. retrieval latency p50/p95 of one query at 10k, 100k and 1M vectors (384-d, MiniLM's size), exact
   (`IndexFlatIP`) vs approximate (HNSW), with recall@10 of the approximate index against the exact
   one [p50 <= 5 ms and recall@10 >= 0.95 at 1M];
4. reindex time: `ExperienceStore.reindex()` over N lesson vectors stored in SQL, and the end-to-end
   `search_lessons` latency (SQL filter + index + fetching the rows) on that store.

The vectors are synthetic but shaped like sentence embeddings: a mixture of 2,000 clusters in a
32-dimensional latent space, mapped linearly to 384 dimensions, plus small isotropic noise, then
normalised (uniform random vectors would be unrealistically hard for any ANN index).

Usage: `python bench/memory_store.py [--sizes 10000,100000,1000000] [--episodes 1000] [--pg-url URL]`.
PostgreSQL is measured when --pg-url or AGENT_RUNTIME_TEST_PG_URL points at a reachable server.
The 1M row builds an HNSW index of a million vectors: expect several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memory import EpisodeRecord, ExperienceStore, MemoryStoreError, StepRecord
from memory.embeddings import HashEmbedder, normalize
from memory.index import VectorIndex
from memory.models import Embedding, Lesson

DIM = 384
LATENT = 32
QUERIES = 200


def episode(i: int, rng: np.random.Generator) -> EpisodeRecord:
    start = dt.datetime.now(dt.UTC)
    steps = []
    for s in range(20):
        steps.append(
            StepRecord(
                index=s,
                observation=f"You are in the kitchen (turn {s}). " + "You see a fridge, a table. " * 10,
                prompt="<|system|>You play a text game.<|user|>" + "History line. " * 100,
                response=f"I think I should open the fridge. Action: open fridge {rng.integers(100)}",
                action="open fridge",
                valid_action=True,
                reward=float(rng.random()),
                admissible_actions=["open fridge", "go north", "take apple", "look"],
                prompt_tokens=400,
                completion_tokens=30,
                latency_s=0.4,
                info={"score": s},
            )
        )
    return EpisodeRecord(
        env_id="textworld/coin_collector",
        task_id=f"task-{i}",
        seed=i,
        policy="smollm2-135m",
        adapter_id=None,
        lesson_set_version=None,
        outcome="won",
        won=True,
        total_return=1.0,
        prompt_tokens=8000,
        completion_tokens=600,
        started_at=start,
        ended_at=start,
        goal="find the coin",
        steps=steps,
    )


def bench_inserts(target: str, episodes: int, label: str) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(0)
    records = [episode(i, rng) for i in range(episodes)]
    rows = []
    with ExperienceStore.open(target, index_dir=tempfile.mkdtemp()) as store:
        run_id = store.create_run("bench", {})
        half = episodes // 2
        t = time.perf_counter()
        for n, record in enumerate(records[:half]):
            store.add_episode(run_id, record, run_state={"episodes": n})
        per_episode = 20 * half / (time.perf_counter() - t)
        t = time.perf_counter()
        for start in range(half, episodes, 50):
            store.add_episodes(run_id, records[start : start + 50], run_state={"episodes": start})
        batched = 20 * (episodes - half) / (time.perf_counter() - t)
        steps = store.stats()["steps"]
    rows.append((f"insert, {label}, 1 transaction per episode", f"{per_episode:,.0f} steps/s", ""))
    rows.append((f"insert, {label}, batches of 50 episodes", f"{batched:,.0f} steps/s", ""))
    if label == "SQLite":
        path = Path(target) / "memory.db"
        size = path.stat().st_size  # the store closed cleanly, so the WAL is checkpointed
        rows.append(("disk, SQLite", f"{size / steps:,.0f} bytes/step", f"{steps:,} steps, {size / 2**20:,.1f} MiB"))
    return rows


def synthetic(n: int, rng: np.random.Generator, basis: np.ndarray, centers: np.ndarray) -> np.ndarray:
    out = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, 100_000):
        m = min(100_000, n - start)
        z = centers[rng.integers(0, len(centers), m)] + 0.6 * rng.standard_normal((m, LATENT))
        x = z.astype(np.float32) @ basis + 0.28 * rng.standard_normal((m, DIM)).astype(np.float32)
        out[start : start + m] = normalize(x)
    return out


def latencies(index: VectorIndex, queries: np.ndarray) -> tuple[list[list[int]], np.ndarray]:
    found, times = [], []
    for q in queries:
        t = time.perf_counter()
        hits = index.search(q, 10)
        times.append(time.perf_counter() - t)
        found.append([i for i, _ in hits])
    return found, np.array(times) * 1e3


def bench_retrieval(sizes: list[int]) -> list[tuple[str, ...]]:
    rng = np.random.default_rng(0)
    basis = rng.standard_normal((LATENT, DIM)).astype(np.float32)
    centers = rng.standard_normal((2000, LATENT)).astype(np.float32)
    rows = []
    for n in sizes:
        vectors = synthetic(n, rng, basis, centers)
        queries = synthetic(QUERIES, rng, basis, centers)
        ids = np.arange(1, n + 1, dtype=np.int64)
        exact = VectorIndex.build(ids, vectors, approx_threshold=n)
        truth, exact_ms = latencies(exact, queries)
        del exact
        t = time.perf_counter()
        approx = VectorIndex.build(ids, vectors, approx_threshold=0)
        build_s = time.perf_counter() - t
        found, approx_ms = latencies(approx, queries)
        recall = np.mean([len(set(f) & set(g)) / 10 for f, g in zip(found, truth)])
        rows.append(
            (
                f"{n:,}",
                "exact (Flat)",
                f"{np.percentile(exact_ms, 50):.2f}",
                f"{np.percentile(exact_ms, 95):.2f}",
                "1.000",
                "-",
            )
        )
        rows.append(
            (
                f"{n:,}",
                "approximate (HNSW32)",
                f"{np.percentile(approx_ms, 50):.2f}",
                f"{np.percentile(approx_ms, 95):.2f}",
                f"{recall:.3f}",
                f"{build_s:.1f}",
            )
        )
        print(f"  retrieval at {n:,} done", file=sys.stderr, flush=True)
        del approx, vectors
    return rows


def bench_reindex(n: int, workdir: Path) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(1)
    basis = rng.standard_normal((LATENT, DIM)).astype(np.float32)
    centers = rng.standard_normal((2000, LATENT)).astype(np.float32)
    embedder = HashEmbedder(DIM)
    with ExperienceStore.open(workdir, embedder=embedder, approx_threshold=n // 2) as store:
        run_id = store.create_run("bench", {})
        vectors = synthetic(n, rng, basis, centers)
        now = dt.datetime.now(dt.UTC)
        with store._write() as session:  # bulk-load lessons with vectors, as if embedded before
            for start in range(0, n, 10_000):
                chunk = range(start, min(n, start + 10_000))
                session.execute(
                    Lesson.__table__.insert(),
                    [
                        {
                            "id": i + 1,
                            "run_id": run_id,
                            "text": f"lesson {i}",
                            "status": "active",
                            "pool": i % 10,
                            "source_episode_ids": [],
                            "token_count": 10,
                            "times_in_context": 0,
                            "wins_in_context": 0,
                            "created_at": now,
                            "updated_at": now,
                            "metadata": {},
                        }
                        for i in chunk
                    ],
                )
                session.execute(
                    Embedding.__table__.insert(),
                    [
                        {
                            "kind": "lesson",
                            "model": embedder.name,
                            "item_id": i + 1,
                            "dim": DIM,
                            "vector": vectors[i].tobytes(),
                            "created_at": now,
                        }
                        for i in chunk
                    ],
                )
        t = time.perf_counter()
        store.reindex()
        reindex_s = time.perf_counter() - t
        times = []
        for i in range(50):
            t = time.perf_counter()
            store.search_lessons(f"lesson {i}", k=10, pool=3)
            times.append(time.perf_counter() - t)
    ms = np.array(times) * 1e3
    return [
        (f"reindex, {n:,} lesson vectors (HNSW)", f"{reindex_s:.1f} s", "from vectors in SQLite"),
        (
            f"store.search_lessons(k=10, pool filter), {n:,}",
            f"p50 {np.percentile(ms, 50):.1f} ms, p95 {np.percentile(ms, 95):.1f} ms",
            "embed query + index + SQL filter + rows",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--reindex-size", type=int, default=100_000)
    parser.add_argument("--pg-url", default=os.environ.get("AGENT_RUNTIME_TEST_PG_URL"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        rows = bench_inserts(str(Path(tmp) / "sqlite"), args.episodes, "SQLite")
        if args.pg_url:
            try:
                engine = create_engine(args.pg_url)
                with engine.begin() as conn:  # a clean schema for the bench
                    conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
                engine.dispose()
                rows += bench_inserts(args.pg_url, args.episodes, "PostgreSQL")
            except (SQLAlchemyError, MemoryStoreError) as exc:  # the bench still reports SQLite without a server
                rows.append(("insert, PostgreSQL", "skipped", str(exc).splitlines()[0][:80]))
        rows += bench_reindex(args.reindex_size, Path(tmp) / "reindex")
    print("| measure | result | notes |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print("| vectors | index | p50 ms | p95 ms | recall@10 | build s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in bench_retrieval([int(s) for s in args.sizes.split(",")]):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
