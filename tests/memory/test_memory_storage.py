"""Bounded storage: prompts stored as recipes and rebuilt exactly, the migration that
converts older databases in place, cycle curves appended a step at a time."""

from __future__ import annotations

import datetime as dt
import io
import random
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import MetaData, create_engine, func, select

from agent_runtime.episode.prompt import PromptBuilder, Turn
from memory import ExperienceStore, StepRecord
from memory.migrate import MIGRATIONS_DIR
from memory.models import PromptPart, Step
from memory.prompts import PromptEncoder, rebuild_prompts
from memory.testing import game_episode

WHEN = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def _chat_text(chat: list[dict[str, str]]) -> str:
    """A chat template of the usual shape (each message between markers, then the reply's opening)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat) + "<|im_start|>assistant\n"


def played(task: str, n: int, *, lessons: list[str], seed: int, history: int = 4) -> list[StepRecord]:
    """An episode's steps with the prompts the agent's PromptBuilder makes (history trimmed to `history`
    turns, so late prompts drop a block of old turns from the middle)."""
    rng = random.Random(seed)
    builder = PromptBuilder(
        family="text",
        count_tokens=lambda chat: sum(len(m["content"]) for m in chat) // 4,
        context_window=100_000,
        max_history_turns=history,
        lessons=lessons,
    )
    turns: list[Turn] = []
    steps = []
    for i in range(n):
        observation = (
            f"-= Room {rng.randint(1, 9)} =-\nYou are in {task}, turn {i}. There is a door.\x00"
            + "." * rng.randint(0, 40)
        )
        admissible = ["go north", "go south", "take coin"][: rng.randint(1, 3)]
        prompt = _chat_text(builder.build(turns, observation, admissible))
        reply = rng.choice(["go north", "take coin", "  look  "])
        steps.append(
            StepRecord(
                index=i,
                observation=observation,
                prompt=prompt,
                response=reply,
                action=reply.strip(),
                valid_action=True,
                reward=0.0,
                admissible_actions=admissible,
            )
        )
        turns.append(Turn(observation, reply, admissible))
    return steps


def test_recipes_rebuild_every_prompt_exactly() -> None:
    """Whatever the prompts (extending, trimmed, unrelated, repeated, out of order, empty), rebuilding the
    recipes gives the texts back (NUL as U+FFFD, as the database stores text)."""
    episodes = {
        "game": [(s.index, s.observation, s.prompt) for s in played("the attic", 14, lessons=["Take it."], seed=1)],
        "unrelated": [(0, "x", "first prompt"), (1, "", "second, unrelated"), (2, "second", "second, unrelated!!")],
        "repeats": [(i, "same obs here", "sys " * 20 + "same obs here" * (i + 1)) for i in range(5)],
        "reversed": [
            (3, "obs three long", "S" * 40 + "obs three long"),
            (1, "obs one long", "S" * 40 + "obs one long"),
        ],
        "empty": [(0, "", ""), (1, "", "")],
    }
    encoder = PromptEncoder()
    for key, steps in episodes.items():
        parts: dict[int, str] = {}
        rows = []
        for index, observation, prompt in steps:
            recipe = encoder.encode(key, index, observation, prompt)
            part = None
            if recipe.part is not None:
                part = len(parts) + 1
                parts[part] = recipe.part
            rows.append(
                {"step_index": index, "observation": observation.replace("\x00", "\ufffd"), **recipe.columns(part)}
            )
        rebuilt = rebuild_prompts(rows, parts)
        assert rebuilt == {i: p.replace("\x00", "\ufffd") for i, _, p in steps}, key


def test_stored_prompts_are_exact_and_small(memory_url: str, tmp_path: Path) -> None:
    lessons = ["Before moving, read the room for a coin.", "Take the coin as soon as you see it."]
    records = []
    for e in range(6):
        record = game_episode("textworld/coin_collector", f"t{e}", won=True, n_steps=1)
        record.steps = played(f"room {e}", 12, lessons=lessons, seed=e)
        records.append(record)
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "i") as store:
        run = store.create_run("r", {})
        ids = store.add_episodes(run, records[:3]) + [store.add_episode(run, r) for r in records[3:]]
        whole = own = 0
        for episode_id, record in zip(ids, records, strict=True):
            got = store.episode(episode_id)
            for step, sent in zip(got.steps, record.steps, strict=True):
                assert step.prompt == sent.prompt.replace("\x00", "\ufffd")
                assert store.step_prompt(episode_id, step.index) == step.prompt
                whole += len(step.prompt)
        with store.engine.connect() as conn:
            own = conn.scalar(select(func.sum(func.length(Step.prompt))))
            parts = conn.scalar(select(func.count()).select_from(PromptPart))
        assert parts == 1, "the six episodes share one system part"
        assert own < whole / 8, (own, whole)


def _alembic(connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def _sql_url(memory_url: str) -> str:
    return memory_url if "://" in memory_url else f"sqlite:///{memory_url}/memory.db"


def test_migration_0003_converts_a_database_in_place(memory_url: str, tmp_path: Path) -> None:
    """A database at 0002 with whole prompts: opened, its prompts read back the same through the store while
    the prompt column holds a fraction; lesson sources are rows; downgraded, the whole prompts are back."""
    if "://" not in memory_url:
        Path(memory_url).mkdir(parents=True)
    steps = {e: played(f"room {e}", 10, lessons=["Look."], seed=e) for e in (1, 2, 3)}
    engine = create_engine(_sql_url(memory_url))
    with engine.begin() as conn:
        command.upgrade(_alembic(conn), "0002")
        t = MetaData()
        t.reflect(conn)
        t = t.tables
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
            t["episodes"].insert(),
            [
                {
                    "id": e,
                    "run_id": 1,
                    "env_id": "textworld/coin_collector",
                    "task_id": f"t{e}",
                    "seed": e,
                    "policy": "p",
                    "outcome": "won",
                    "won": True,
                    "total_return": 1.0,
                    "num_steps": 10,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "started_at": WHEN,
                    "ended_at": WHEN,
                    "summary": "",
                    "lessons_in_context": [],
                    "metadata": {},
                }
                for e in steps
            ],
        )
        conn.execute(
            t["steps"].insert(),
            [
                {
                    "episode_id": e,
                    "step_index": s.index,
                    "observation": s.observation.replace("\x00", "\ufffd"),
                    "prompt": s.prompt.replace("\x00", "\ufffd"),
                    "response": s.response,
                    "action": s.action,
                    "valid_action": True,
                    "reward": 0.0,
                    "admissible_actions": s.admissible_actions,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "latency_s": 0.0,
                    "info": {},
                }
                for e, ss in steps.items()
                for s in ss
            ],
        )
        conn.execute(
            t["lessons"].insert(),
            [
                {
                    "id": 7,
                    "run_id": 1,
                    "text": "Look.",
                    "status": "active",
                    "pool": 0,
                    "env_id": None,
                    "source_episode_ids": [2, 3, 3],
                    "token_count": 1,
                    "times_in_context": 0,
                    "wins_in_context": 0,
                    "created_at": WHEN,
                    "updated_at": WHEN,
                    "metadata": {},
                }
            ],
        )
        conn.execute(
            t["opcd_cycles"].insert(),
            [
                {
                    "id": 1,
                    "run_id": 1,
                    "status": "promoted",
                    "config": {},
                    "metrics": {},
                    "curves": {"loss": [1.0]},
                    "started_at": WHEN,
                }
            ],
        )
        whole = conn.scalar(select(func.sum(func.length(t["steps"].c.prompt))))
    engine.dispose()
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "i") as store:
        for e, sent in steps.items():
            assert [s.prompt for s in store.episode(e).steps] == [s.prompt.replace("\x00", "\ufffd") for s in sent]
        assert [x.id for x in store.lessons_from_episode(3)] == [7] and store.lessons_from_episode(1) == []
        assert store.get_cycle(1).episode_ids == [] and store.get_cycle(1).curves == {"loss": [1.0]}
        with store.engine.connect() as conn:
            stored = conn.scalar(select(func.sum(func.length(Step.prompt))))
        assert stored < whole / 4, (stored, whole)
        exported = io.StringIO()
        store.export_jsonl(exported)
    engine = create_engine(_sql_url(memory_url))
    with engine.begin() as conn:
        command.downgrade(_alembic(conn), "0002")
        t = MetaData()
        t.reflect(conn)
        prompts = conn.execute(
            select(t.tables["steps"].c.episode_id, t.tables["steps"].c.step_index, t.tables["steps"].c.prompt)
        ).all()
        assert "prompt_parts" not in t.tables and "prompt_base" not in t.tables["steps"].c
    engine.dispose()
    assert {(e, i): p for e, i, p in prompts} == {
        (e, s.index): s.prompt.replace("\x00", "\ufffd") for e, ss in steps.items() for s in ss
    }


def test_cycle_curves_are_appended_a_step_at_a_time(memory_url: str, tmp_path: Path) -> None:
    with ExperienceStore.open(memory_url, index_dir=tmp_path / "i") as store:
        run = store.create_run("r", {})
        played_ids = store.add_episodes(run, [game_episode("x/y", f"t{i}", won=True, n_steps=1) for i in range(3)])
        cycle = store.start_cycle(run, {}, episode_ids=[played_ids[2], played_ids[0], played_ids[2]])
        assert store.get_cycle(cycle).episode_ids == [played_ids[0], played_ids[2]]
        for step in range(4):
            assert store.append_cycle_point(cycle, {"loss": 1.0 / (step + 1), "kl": float("nan")}) == step
            running = store.cycles(run, status="running")
            assert [len(c.curves["loss"]) for c in running] == [step + 1], "a polling driver sees each step"
        assert store.get_cycle(cycle).curves == {"loss": [1.0, 0.5, 1 / 3, 0.25], "kl": [None] * 4}
        copy_dir = tmp_path / "copy"
        text = io.StringIO()
        store.export_jsonl(text)
        with ExperienceStore.open(copy_dir) as copy:
            copy.import_jsonl(io.StringIO(text.getvalue()))
            assert copy.get_cycle(cycle).curves == store.get_cycle(cycle).curves
            again = io.StringIO()
            copy.export_jsonl(again)
        assert again.getvalue().splitlines()[1:] == text.getvalue().splitlines()[1:]
        store.update_cycle(cycle, curves={"loss": [9.0]})
        assert store.get_cycle(cycle).curves == {"loss": [9.0]}, "a whole write replaces the points"
        store.update_cycle(cycle, episode_ids=[played_ids[1]])
        assert store.get_cycle(cycle).episode_ids == [played_ids[1]]


def test_each_point_is_one_small_row(tmp_path: Path) -> None:
    """Appending is O(1): the cycle's JSON is not rewritten (its row stays the same size)."""
    with ExperienceStore.open(tmp_path) as store:
        cycle = store.start_cycle(store.create_run("r", {}), {"x": 1})
        sizes = []
        for _ in range(50):
            store.append_cycle_point(cycle, {"loss": 0.5, "kl": 0.1, "grad_norm": 1.0})
            with store.engine.connect() as conn:
                sizes.append(conn.exec_driver_sql("SELECT length(curves) FROM opcd_cycles").scalar())
        assert len(set(sizes)) == 1
        assert len(store.get_cycle(cycle).curves["grad_norm"]) == 50


@pytest.mark.parametrize("n", [0, 3])
def test_episodes_without_prompts(store: ExperienceStore, n: int) -> None:
    run = store.create_run("r", {})
    record = game_episode("x/y", "t", won=False, n_steps=max(n, 1))
    record.steps = record.steps[:n]
    for step in record.steps:
        step.prompt = ""
    episode = store.add_episode(run, record)
    assert [s.prompt for s in store.episode(episode).steps] == [""] * n
