"""Evaluation that cannot leak: an evaluation task's episode planted in the store (under its own task id, and
the same game under another id) reaches neither EXTRACT (as a reader or a contrastive partner), nor an OPCD
cycle's prompts, nor the retrieved examples; naming it explicitly for extraction is an error; retrieval never
shows the task being played; `agent-runtime eval` prints the check it ran."""

from __future__ import annotations

import pytest

import environments
from agent_runtime.config import config_from_dict
from agent_runtime.episode.examples import example_retriever
from agent_runtime.episode.openings import observation_hash
from agent_runtime.evaluation.heldout import EvalLeakError, held_out
from agent_runtime.llm.scripted import ScriptedBackend
from agent_runtime.phases.extract import learnable_recent, run_extract
from agent_runtime.phases.turn_prompts import episode_prefixes
from agent_runtime.run.loop import AgentLoop
from agent_runtime.state import Run
from distill.lessons.contrast import pick_partners
from memory import ExperienceStore
from memory.testing import game_episode

ENV = "textworld/coin_collector"


def config(games_dir, episodes=8):
    kwargs = {"level": 1, "n_train": 4, "n_eval": 2, "cache_dir": str(games_dir)}
    return config_from_dict(
        {
            "name": "t",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [{"id": ENV, "max_steps": 4, "kwargs": kwargs}],
            "runtime": {"slots": 2, "episodes": episodes},
            "evaluation": {"episodes_per_env": 2},
            "agent": {"retrieved_examples": 1},
            "memory": {"embedder": "hash"},
            "lessons": {
                "enabled": True,
                "extract_every": 4,
                "gate_episodes": 0,
                "embedder": "hash",
                "contrastive": True,
                "extractor": "agent_runtime.llm.fake_chat:LessonWriter",
            },
        }
    )


def plant(store, run_id, games_dir, cfg) -> list[int]:
    """Two won episodes of the first eval game: under its task id, and the same game under a train-like id."""
    env = environments.make(ENV, **cfg.envs[0].kwargs)
    task = env.tasks("eval")[0]
    first, _ = env.reset(seed=cfg.evaluation.seed, task_id=task)
    env.close()
    ids = []
    for task_id in (task, "renamed-copy-of-an-eval-game"):
        record = game_episode(ENV, task_id, won=True, observation=first)
        record.steps[-1].action = "take the planted coin"
        ids.append(store.add_episode(run_id, record))
    return ids


@pytest.mark.slow
def test_a_planted_eval_episode_reaches_nothing_downstream(tmp_path, games_dir):
    cfg = config(games_dir)
    loop = AgentLoop(cfg, tmp_path, progress=False)
    planted = plant(loop.store, loop.run_id, games_dir, cfg)
    held = held_out(cfg, tmp_path)
    assert held.size == 2 and not any(held.usable(loop.store.episode(i)) for i in planted)

    assert set(learnable_recent(Run(cfg, tmp_path, loop.store, loop.run_id), 8)).isdisjoint(planted)
    with pytest.raises(EvalLeakError, match="EXTRACT: 1 held-out evaluation task"):
        run_extract(Run(cfg, tmp_path, loop.store, loop.run_id), ScriptedBackend(), [planted[1]])
    assert episode_prefixes(Run(cfg, tmp_path, loop.store, loop.run_id), ScriptedBackend(), 100) == []
    retrieve = example_retriever(loop.store, loop.run_id, 1, lambda: held)
    observation = loop.store.episode(planted[0]).steps[0].observation
    assert retrieve(ENV, "some train task", observation) == []

    summary = loop.run()  # 8 real episodes, two EXTRACT phases with contrastive partners, retrieval on
    loop.close()
    assert summary.extractions == 2
    with ExperienceStore.open(tmp_path) as store:
        read = {i for x in store.extractions(summary.run_id, limit=1000) for i in x.episode_ids}  # with partners
        assert read and read.isdisjoint(planted)
        assert all(set(x.source_episode_ids).isdisjoint(planted) for x in store.lessons(summary.run_id))
        prompts = [
            s.prompt
            for e in store.episodes(summary.run_id, limit=100)
            if e.id not in planted
            for s in store.episode(e.id).steps
        ]
        assert prompts and not any("take the planted coin" in p for p in prompts)
        episodes = [store.episode(e.id) for e in store.episodes(summary.run_id, limit=100) if e.id not in planted]
        partner_pool = pick_partners(store, summary.run_id, episodes, usable=held.usable)
        assert {p.id for p in partner_pool.values()}.isdisjoint(planted)
        assert [
            d
            for d in episode_prefixes(Run(cfg, tmp_path, store, summary.run_id), ScriptedBackend(), 100)
            if set(d.episode_ids) & set(planted)
        ] == []


def test_retrieval_never_shows_the_task_being_played(tmp_path, games_dir):
    """Not under its own task id, nor the same game under another id (its opening, whitespace aside); another
    game is shown."""
    cfg = config(games_dir)
    with ExperienceStore.open(tmp_path, embedder="hash") as store:
        run_id = store.create_run("t", {})
        store.add_episode(run_id, game_episode(ENV, "train-task-1", won=True, observation="A room with a coin."))
        retrieve = example_retriever(store, run_id, 1, lambda: held_out(cfg, tmp_path))
        assert retrieve(ENV, "train-task-1", "A room with a coin.") == []
        assert retrieve(ENV, "a-copy-of-train-task-1", "A room  with a\ncoin.") == [], "the same game, another id"
        assert len(retrieve(ENV, "train-task-2", "A room with a coin and a door.")) == 1


def test_retrieval_by_opening_spares_a_game_whose_tasks_all_open_alike(tmp_path):
    """GuessEnv opens every task with the same sentence: that opening does not identify the game being played,
    so another task's episode is still an example (its task id still excludes the task itself)."""
    guess = "environments.testing:GuessEnv"
    cfg = config_from_dict(
        {
            "name": "g",
            "model": {"name": "scripted", "backend": "scripted"},
            "envs": [{"id": guess}],
            "evaluation": {"episodes_per_env": 2},
        }
    )
    held = held_out(cfg, tmp_path)
    opening = environments.make(guess).reset(seed=0, task_id="train-0")[0]
    assert not held.identifies(guess, observation_hash(opening))
    with ExperienceStore.open(tmp_path, embedder="hash") as store:
        run_id = store.create_run("g", {})
        store.add_episode(run_id, game_episode(guess, "train-3", won=True, observation=opening))
        retrieve = example_retriever(store, run_id, 1, lambda: held)
        assert len(retrieve(guess, "train-4", opening)) == 1
        assert retrieve(guess, "train-3", opening) == []


def test_the_eval_leak_check_names_what_learned_from_a_held_out_task(tmp_path, games_dir):
    from agent_runtime.evaluation.heldout import leak_report

    cfg = config(games_dir)
    with ExperienceStore.open(tmp_path, embedder="hash") as store:
        run_id = store.create_run("t", {})
        planted = plant(store, run_id, games_dir, cfg)
        clean = store.add_episode(run_id, game_episode(ENV, "train-1", won=True))
        held = held_out(cfg, tmp_path)
        assert leak_report(store, run_id, held).clean
        lesson = store.add_lesson("Take the coin.", run_id=run_id, source_episode_ids=[planted[1]])
        store.create_lesson_set(run_id, [lesson])
        adapter = store.add_adapter("cycle-1", str(tmp_path / "a"), run_id=run_id, status="active")
        cycle = store.start_cycle(run_id, {}, episode_ids=[clean, planted[0]])
        store.update_cycle(cycle, adapter_id=adapter)
        report = leak_report(store, run_id, held, store.active_adapter(run_id))
    assert report.leaked_episodes == planted and report.leaked_lessons == [lesson]
    assert report.leaked_adapter_episodes == [planted[0]] and not report.clean and "LEAKED" in report.line()


def test_a_gate_that_played_held_out_games_makes_the_leak_check_not_clean(tmp_path):
    """A run stored when the gate played the eval split: its gate row's games are the ones the table reports."""
    from agent_runtime.evaluation.heldout import HeldOut, decisions_on_reported, leak_report
    from distill.lessons import decide_gate, store_gate_decision

    held = HeldOut(frozenset({(ENV, "eval-0"), (ENV, "eval-1")}), frozenset())
    with ExperienceStore.open(tmp_path, embedder="hash") as store:
        run_id = store.create_run("t", {})
        versions = {"run_id": run_id, "env_id": ENV, "current_version": None, "candidate_version": 1}
        train = {(ENV, "train-0", 0): True, (ENV, "train-1", 1): False}
        store_gate_decision(store, decide_gate(train, train), **versions)
        assert leak_report(store, run_id, held).clean
        on_eval = {(ENV, "eval-0", 1234): True, (ENV, "eval-1", 1235): False}
        row = store_gate_decision(store, decide_gate(on_eval, on_eval), **versions)
        report = leak_report(store, run_id, held)
        assert decisions_on_reported(store, run_id) == []  # nothing reported in the store yet
        episodes = [{"task_id": "eval-1", "seed": 1235, "won": False}]
        store.add_evaluation(ENV, run_id=run_id, split="eval", num_episodes=1, metrics={"episodes": episodes})
        from_store = decisions_on_reported(store, run_id)  # what `report` and `run` print beside their tables
    named = f"gate row {row} played 2 held-out game(s): {ENV} 'eval-0' seed 1234, {ENV} 'eval-1' seed 1235"
    assert not report.clean and report.decisions_on_held_out == [named]
    assert "NOT CLEAN" in report.line() and named in report.line()
    assert from_store == [f"gate row {row} played 1 held-out game(s): {ENV} 'eval-1' seed 1235"]
