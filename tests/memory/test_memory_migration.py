"""Revision 0002 on a database written at revision 0001: state moves from note prefixes and `split` strings
into columns, and the old database then reads back as one the new code writes (SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import MetaData, create_engine, select

from distill.lessons import is_user_version, live_version, pending_candidate
from memory import (
    EVALUATION_EVAL,
    EVALUATION_GATE,
    EVALUATION_LESSON_UTILITY,
    LESSON_SET_CANDIDATE,
    LESSON_SET_LIVE,
    MADE_BY_AGENT,
    MADE_BY_USER,
    ExperienceStore,
    InvalidRecordError,
)
from memory.migrate import MIGRATIONS_DIR, current_revision

WHEN = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
# (note at revision 0001, then what 0002 reads from it: status, made_by, note), in version order. The notes
# are the ones revision 0001's code wrote: versions.create_version ("candidate: ..."/"live: ..."), a
# person's versions (the curator's label "user:" joined with "; ", `lessons retire` with " "), another
# tool's versions without a prefix (live), and the empty or bare ones.
LESSON_SETS = [
    (
        "candidate: pool 0: add 1; extracted from 4 episodes",
        LESSON_SET_CANDIDATE,
        MADE_BY_AGENT,
        "pool 0: add 1; extracted from 4 episodes",
    ),
    (
        "live: promoted candidate v1; promoted: candidate 0.5 vs current 0.5",
        LESSON_SET_LIVE,
        MADE_BY_AGENT,
        "promoted candidate v1; promoted: candidate 0.5 vs current 0.5",
    ),
    (
        "candidate: user:; pool 0: add 1; pool 1: add 1; lessons add",
        LESSON_SET_CANDIDATE,
        MADE_BY_USER,
        "pool 0: add 1; pool 1: add 1; lessons add",
    ),
    ("live: user: retired #1; lessons retire", LESSON_SET_LIVE, MADE_BY_USER, "retired #1; lessons retire"),
    ("after episode 40", LESSON_SET_LIVE, MADE_BY_AGENT, "after episode 40"),
    ("", LESSON_SET_LIVE, MADE_BY_AGENT, ""),
    ("live:", LESSON_SET_LIVE, MADE_BY_AGENT, ""),
    (
        "Candidate: not a prefix (case matters)",
        LESSON_SET_LIVE,
        MADE_BY_AGENT,
        "Candidate: not a prefix (case matters)",
    ),
    ("candidate: user:", LESSON_SET_CANDIDATE, MADE_BY_USER, ""),
]
# (split at revision 0001, the kind 0002 gives the row)
EVALUATIONS = [
    ("eval", EVALUATION_EVAL),
    ("gate", EVALUATION_GATE),
    ("lesson-utility", EVALUATION_LESSON_UTILITY),
    ("train", EVALUATION_EVAL),
    ("valid_unseen", EVALUATION_EVAL),
]


def _sql_url(memory_url: str) -> str:
    return memory_url if "://" in memory_url else f"sqlite:///{memory_url}/memory.db"


def _alembic(connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def build_at_0001(memory_url: str) -> None:
    """A database at revision 0001 holding a run, lessons, the lesson sets above (each with members) and
    one evaluation per split above, written as revision 0001's code wrote them."""
    if "://" not in memory_url:
        Path(memory_url).mkdir(parents=True, exist_ok=True)
    engine = create_engine(_sql_url(memory_url))
    with engine.begin() as conn:
        command.upgrade(_alembic(conn), "0001")
        tables = MetaData()
        tables.reflect(conn)
        t = tables.tables
        conn.execute(
            t["runs"].insert(),
            [
                {
                    "id": 1,
                    "name": "old",
                    "config": {},
                    "phase": "PLAY",
                    "state": {},
                    "status": "running",
                    "created_at": WHEN,
                    "updated_at": WHEN,
                }
            ],
        )
        conn.execute(
            t["lessons"].insert(),
            [
                {
                    "id": i,
                    "run_id": 1,
                    "text": f"lesson {i}",
                    "status": "active",
                    "pool": 0,
                    "env_id": None,
                    "source_episode_ids": [],
                    "token_count": 3,
                    "times_in_context": 0,
                    "wins_in_context": 0,
                    "created_at": WHEN,
                    "updated_at": WHEN,
                    "metadata": {},
                }
                for i in (1, 2, 3)
            ],
        )
        conn.execute(
            t["lesson_sets"].insert(),
            [
                {"id": 10 + v, "run_id": 1, "version": v, "token_count": 7 * v, "note": note, "created_at": WHEN}
                for v, (note, *_) in enumerate(LESSON_SETS, start=1)
            ],
        )
        conn.execute(
            t["lesson_set_members"].insert(),
            [
                {"lesson_set_id": 10 + v, "lesson_id": lesson, "position": p}
                for v in range(1, len(LESSON_SETS) + 1)
                for p, lesson in enumerate((3, 1) if v % 2 else (2,))
            ],
        )
        conn.execute(
            t["evaluations"].insert(),
            [
                {
                    "id": 20 + i,
                    "run_id": 1,
                    "env_id": "toy/corridor",
                    "split": split,
                    "policy": "p",
                    "num_episodes": 4,
                    "success_rate": 0.5,
                    "metrics": {"promote": True},
                    "lesson_set_version": 1,
                    "created_at": WHEN,
                }
                for i, (split, _) in enumerate(EVALUATIONS)
            ],
        )
        assert current_revision(conn) == "0001"
    engine.dispose()


def test_upgrade_moves_state_into_columns_and_keeps_everything_else(memory_url: str, tmp_path: Path) -> None:
    build_at_0001(memory_url)
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "index") as store:
        sets = store.lesson_sets(1)
        assert [(s.status, s.made_by, s.note) for s in sets] == [tuple(row[1:]) for row in LESSON_SETS]
        assert [s.lesson_ids for s in sets] == [[3, 1] if v % 2 else [2] for v in range(1, len(sets) + 1)], (
            "memberships survive the migration (no table was rebuilt under a cascading foreign key)"
        )
        assert [(s.id, s.version, s.token_count, s.created_at) for s in sets] == [
            (10 + v, v, 7 * v, WHEN) for v in range(1, len(sets) + 1)
        ]
        assert [(e.split, e.kind) for e in store.evaluations(1)] == EVALUATIONS
        assert [e.split for e in store.evaluations(1, kind=EVALUATION_GATE)] == ["gate"]
        # what revision 0001's code answered about this history: the newest non-candidate version is live,
        # the newest version is a pending candidate made by a person
        assert live_version(store, 1).version == 8
        assert pending_candidate(store, 1).version == 9 and is_user_version(pending_candidate(store, 1))
        assert [is_user_version(s) for s in sets] == [m == MADE_BY_USER for _, _, m, _ in LESSON_SETS]


def test_a_migrated_database_reads_like_one_the_new_code_wrote(memory_url: str, tmp_path: Path) -> None:
    build_at_0001(memory_url)
    fresh_dir = tmp_path / "fresh"
    with (
        ExperienceStore.open(memory_url, index_dir=tmp_path / "index") as old,
        ExperienceStore.open(fresh_dir, index_dir=tmp_path / "fresh-index") as new,
    ):
        run = new.create_run("old", {})
        lessons = [new.add_lesson(f"lesson {i}", run_id=run, status="active", token_count=3) for i in (1, 2, 3)]
        for v, (_, status, made_by, note) in enumerate(LESSON_SETS, start=1):
            members = [lessons[2], lessons[0]] if v % 2 else [lessons[1]]
            new.create_lesson_set(run, members, token_count=7 * v, note=note, status=status, made_by=made_by)
        for split, kind in EVALUATIONS:
            new.add_evaluation(
                "toy/corridor",
                run_id=run,
                split=split,
                kind=kind,
                policy="p",
                num_episodes=4,
                success_rate=0.5,
                metrics={"promote": True},
                lesson_set_version=1,
            )

        def shown(store: ExperienceStore, run_id: int) -> list[tuple]:
            sets = [
                (s.version, s.lesson_ids, s.status, s.made_by, s.token_count, s.note) for s in store.lesson_sets(run_id)
            ]
            evals = [
                (e.kind, e.split, e.env_id, e.num_episodes, e.success_rate, e.metrics)
                for e in store.evaluations(run_id)
            ]
            return [sets, evals, live_version(store, run_id).version, pending_candidate(store, run_id).version]

        assert shown(old, 1) == shown(new, run)


def test_downgrade_writes_the_prefixes_back(memory_url: str, tmp_path: Path) -> None:
    build_at_0001(memory_url)
    ExperienceStore.open(memory_url, index_dir=tmp_path / "index").close()
    engine = create_engine(_sql_url(memory_url))
    with engine.begin() as conn:
        command.downgrade(_alembic(conn), "0001")
        tables = MetaData()
        tables.reflect(conn)
        notes = conn.execute(select(tables.tables["lesson_sets"].c.note).order_by("version")).scalars().all()
        assert "status" not in tables.tables["lesson_sets"].c and "kind" not in tables.tables["evaluations"].c
    engine.dispose()
    assert notes[:4] == [
        "candidate: pool 0: add 1; extracted from 4 episodes",
        "live: promoted candidate v1; promoted: candidate 0.5 vs current 0.5",
        "candidate: user: pool 0: add 1; pool 1: add 1; lessons add",
        "live: user: retired #1; lessons retire",
    ]
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "index") as store:  # and up again, the same
        assert [(s.status, s.made_by, s.note) for s in store.lesson_sets(1)] == [tuple(r[1:]) for r in LESSON_SETS]
        assert [(e.split, e.kind) for e in store.evaluations(1)] == EVALUATIONS


def test_the_store_refuses_unknown_state_values(store: ExperienceStore) -> None:
    run = store.create_run("r", {})
    with pytest.raises(InvalidRecordError, match="unknown lesson-set status 'pending'; known: live, candidate"):
        store.create_lesson_set(run, [], status="pending")
    with pytest.raises(InvalidRecordError, match="unknown lesson-set maker 'robot'"):
        store.create_lesson_set(run, [], made_by="robot")
    with pytest.raises(InvalidRecordError, match="unknown evaluation kind 'gates'; known: eval, gate, lesson-utility"):
        store.add_evaluation("toy/corridor", run_id=run, kind="gates")
    assert store.lesson_sets(run) == [] and store.evaluations(run) == []
