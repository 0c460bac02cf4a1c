"""Bytes per step of the experience store, before and after prompts became recipes.

What it measures: configs/smoke.yaml is played with its scripted policy (`agent-runtime run`, N episodes), and
its coin-collector episodes are stored three ways, on SQLite and on PostgreSQL:
- before: a database at schema revision 0002 (every step's whole prompt), the rows written as they are;
- migrated: that database opened by this code (migration 0003 converts it in place), then vacuumed;
- fresh: the same rows imported into a new store (what a run writes from now on).
For each it prints the bytes per step of the `steps` table (its rows, TOAST and indexes; plus the
`prompt_parts` rows after), the whole database's growth per step (its size less an empty database's at the
same revision: episodes, runs and every index included), and the mean length of the stored prompt column,
and it checks that every prompt read back through `ExperienceStore.episode` equals the text played.

Sizes: SQLite from `dbstat` (pages of each table and index) after VACUUM; PostgreSQL from
`pg_total_relation_size` after VACUUM FULL.

Usage: `python bench/storage.py [--episodes 1000] [--pg-url URL]`; PostgreSQL is measured when --pg-url or
AGENT_RUNTIME_TEST_PG_URL names a reachable server (its public schema is dropped and recreated: give it a
database of its own). About two minutes, most of it the play.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from alembic import command
from sqlalchemy import MetaData, create_engine, insert, text
from sqlalchemy.exc import SQLAlchemyError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memory import ExperienceStore
from memory.migrate import _config

ENV = "textworld/coin_collector"
KEPT_TABLES = ("runs", "episodes", "steps")


def play(workdir: Path, episodes: int) -> list[dict]:
    """Play configs/smoke.yaml; the coin-collector rows (runs, episodes, steps) of its export."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_runtime",
            "run",
            str(ROOT / "configs" / "smoke.yaml"),
            "--workdir",
            str(workdir),
            "--set",
            f"runtime.episodes={episodes}",
            "--no-progress",
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    out = io.StringIO()
    with ExperienceStore.open(workdir, read_only=True) as store:
        store.export_jsonl(out)
    items = [json.loads(line) for line in out.getvalue().splitlines()[1:-1]]
    coin = {i["row"]["id"] for i in items if i["table"] == "episodes" and i["row"]["env_id"] == ENV}
    return [
        i
        for i in items
        if i["table"] == "runs"
        or (i["table"] == "episodes" and i["row"]["id"] in coin)
        or (i["table"] == "steps" and i["row"]["episode_id"] in coin)
    ]


def export_text(items: list[dict]) -> str:
    counts = {t: sum(1 for i in items if i["table"] == t) for t in KEPT_TABLES}
    header = {"format": "agent-runtime-memory", "version": 1, "schema_revision": "0002", "source": "bench"}
    lines = [json.dumps(header)] + [json.dumps(i) for i in items]
    lines.append(
        json.dumps(
            {
                "end": True,
                "counts": {
                    **dict.fromkeys(
                        (
                            "runs",
                            "adapters",
                            "extractions",
                            "opcd_cycles",
                            "lessons",
                            "lesson_sets",
                            "lesson_set_members",
                            "episodes",
                            "steps",
                            "evaluations",
                            "embeddings",
                        ),
                        0,
                    ),
                    **counts,
                },
            }
        )
    )
    return "\n".join(lines) + "\n"


def write_at_0002(url: str, items: list[dict]) -> None:
    """The rows in a database at revision 0002, with 0002's own tables (reflected), prompts whole."""
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0002")
        tables = MetaData()
        tables.reflect(conn)
        for name in KEPT_TABLES:
            table = tables.tables[name]
            rows = []
            for item in (i for i in items if i["table"] == name):
                row = dict(item["row"])
                for column in table.columns:
                    value = row.get(column.name)
                    kind = str(column.type).upper()
                    if isinstance(value, str) and ("DATETIME" in kind or "TIMESTAMP" in kind):
                        moment = dt.datetime.fromisoformat(value)
                        row[column.name] = moment.replace(tzinfo=None) if engine.dialect.name == "sqlite" else moment
                    elif value is not None and column.name == "vector":
                        row[column.name] = base64.b64decode(value)
                rows.append(row)
            if rows:
                conn.execute(insert(table), rows)
    engine.dispose()


def sizes(url: str) -> dict[str, float]:
    """Bytes of the steps table (with its indexes and TOAST), of prompt_parts, of the whole database."""
    engine = create_engine(url)
    try:
        if engine.dialect.name == "sqlite":
            with engine.connect() as conn:
                conn.connection.dbapi_connection.execute("VACUUM")
                by_name = dict(conn.exec_driver_sql("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").all())
                indexes = dict(
                    conn.exec_driver_sql("SELECT name, tbl_name FROM sqlite_schema WHERE type = 'index'").all()
                )
                steps = sum(v for k, v in by_name.items() if k == "steps" or indexes.get(k) == "steps")
                parts = sum(v for k, v in by_name.items() if k == "prompt_parts" or indexes.get(k) == "prompt_parts")
                mean = conn.exec_driver_sql("SELECT avg(length(CAST(prompt AS BLOB))) FROM steps").scalar()
                return {"steps": steps, "parts": parts, "database": sum(by_name.values()), "prompt": mean}
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM FULL")
            has_parts = conn.exec_driver_sql("SELECT to_regclass('prompt_parts') IS NOT NULL").scalar()
            return {
                "steps": conn.exec_driver_sql("SELECT pg_total_relation_size('steps')").scalar(),
                "parts": conn.exec_driver_sql("SELECT pg_total_relation_size('prompt_parts')").scalar()
                if has_parts
                else 0,
                "database": conn.exec_driver_sql(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind = 'r'"
                ).scalar(),
                "prompt": conn.exec_driver_sql("SELECT avg(octet_length(prompt)) FROM steps").scalar(),
            }
    finally:
        engine.dispose()


def check_prompts(target: str, items: list[dict], index_dir: Path) -> None:
    with ExperienceStore.open(target, index_dir=index_dir) as store:
        for item in (i for i in items if i["table"] == "episodes"):
            played = {
                s["row"]["step_index"]: s["row"]["prompt"]
                for s in items
                if s["table"] == "steps" and s["row"]["episode_id"] == item["row"]["id"]
            }
            got = {s.index: s.prompt for s in store.episode(item["row"]["id"]).steps}
            assert got == played, f"episode {item['row']['id']}: prompts differ"


def reset_pg(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


def measure(backend: str, url_for: Callable[[str], str], items: list[dict], tmp: Path) -> list[tuple[str, dict]]:
    """Per step: the steps table, + prompt parts, the whole database's growth over an empty one at the same
    revision (every table and index has a fixed minimum size, which a few hundred steps would not amortise)."""
    n_steps = sum(1 for i in items if i["table"] == "steps")
    rows = []
    before = url_for("empty-0002")
    write_at_0002(before, [])
    empty = {"0002": sizes(before)["database"]}
    before = url_for("empty-0003")
    ExperienceStore.open(before, index_dir=tmp / f"{backend}-empty").close()
    empty["0003"] = sizes(before)["database"]
    before = url_for("before")
    write_at_0002(before, items)
    rows.append(("before (0002: whole prompts)", sizes(before), empty["0002"]))
    ExperienceStore.open(before, index_dir=tmp / f"{backend}-i0").close()  # migrates to 0003 in place
    check_prompts(before, items, tmp / f"{backend}-i0")
    rows.append(("migrated in place (0003)", sizes(before), empty["0003"]))
    fresh = url_for("fresh")
    with ExperienceStore.open(fresh, index_dir=tmp / f"{backend}-i1") as store:
        store.import_jsonl(io.StringIO(export_text(items)))
    check_prompts(fresh, items, tmp / f"{backend}-i1")
    rows.append(("fresh store (0003)", sizes(fresh), empty["0003"]))
    out = []
    for label, size, base in rows:
        per_step = {k: (v or 0) / n_steps for k, v in size.items() if k != "prompt"}
        per_step["growth"] = (size["database"] - base) / n_steps
        out.append((f"{backend}: {label}", {**per_step, "prompt": size["prompt"] or 0}))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--pg-url", default=os.environ.get("AGENT_RUNTIME_TEST_PG_URL"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        items = play(tmp / "smoke", args.episodes)
        n_steps = sum(1 for i in items if i["table"] == "steps")
        n_episodes = sum(1 for i in items if i["table"] == "episodes")
        observation = sum(len(i["row"]["observation"].encode()) for i in items if i["table"] == "steps") / n_steps
        print(
            f"configs/smoke.yaml, {args.episodes} episodes played: {n_episodes} coin-collector episodes, "
            f"{n_steps} steps, mean observation {observation:.0f} B\n"
        )
        results = measure("SQLite", lambda name: f"sqlite:///{tmp / (name + '.db')}", items, tmp)
        if args.pg_url:

            def pg(_name: str) -> str:  # one database, emptied for each of its stores in turn
                reset_pg(args.pg_url)
                return args.pg_url

            try:
                results += measure("PostgreSQL", pg, items, tmp)
            except SQLAlchemyError as exc:
                print(f"PostgreSQL not measured: {exc}\n")
        print(
            "| store | steps table, B/step | + prompt parts, B/step | database growth, B/step | stored prompt, mean B |"
        )
        print("|---|---:|---:|---:|---:|")
        for label, s in results:
            print(
                f"| {label} | {s['steps']:.0f} | {s['steps'] + s['parts']:.0f} | {s['growth']:.0f} "
                f"| {s['prompt']:.0f} |"
            )
        print("\nevery prompt read back through ExperienceStore.episode equals the text played")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
