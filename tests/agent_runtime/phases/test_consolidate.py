"""The whole cycle in the loop on a tiny model: PLAY -> EXTRACT -> CONSOLIDATE -> EVALUATE -> PROMOTE or
ROLLBACK, with the adapter on disk, curves and evaluations in memory, and a resumable cursor."""

from __future__ import annotations

import math
from collections import namedtuple
from pathlib import Path

import pytest

from agent_runtime.evaluation.cycle_table import learning_table
from agent_runtime.run.loop import AgentLoop
from memory import ExperienceStore


@pytest.mark.slow
def test_cycle_in_the_loop(tmp_path, cycle_config):
    loop = AgentLoop(cycle_config(), tmp_path, progress=False)
    summary = loop.run()
    assert loop.backend.active_adapter is None, "after a rollback the loop acts with the parent (the base model)"
    loop.close()
    assert summary.cycles == 1 and summary.extractions == 2
    # where the time went (bench/loop.py's profile): each phase, and the tokens it put through the model
    profile = loop.profile.phases
    assert {
        "START",
        "START: model",
        "PLAY",
        "EXTRACT",
        "CONSOLIDATE",
        "CONSOLIDATE: train",
        "CONSOLIDATE: evaluate",
    } <= set(profile)
    assert profile["PLAY"].decisions >= 4 and profile["PLAY"].prompt_tokens > 0
    # the backend's prefix KV store leaves part of the prompts to run: counted per phase, never more than was asked
    assert 0 < profile["PLAY"].prefilled_tokens <= profile["PLAY"].prompt_tokens
    train, evaluate = profile["CONSOLIDATE: train"], profile["CONSOLIDATE: evaluate"]
    assert train.train_tokens > 0 and train.teacher_tokens > 0 and train.prompt_tokens == 0
    assert train.scored_tokens > 0, "the held-out KL runs the student forward without gradients"
    assert profile["CONSOLIDATE: train"].forward_tokens == train.teacher_tokens + train.scored_tokens
    assert evaluate.decisions > 0 and evaluate.train_tokens == 0
    assert profile["CONSOLIDATE"].wall_s >= train.wall_s + evaluate.wall_s > 0
    assert profile["CONSOLIDATE"].train_tokens == train.train_tokens
    with ExperienceStore.open(tmp_path) as store:
        [cycle] = store.cycles(summary.run_id)
        # the fixture's fake lessons leave the tiny model's choices as they are (KL ~0 before), so any step
        # moves the student away from its teacher: no evidence of learning, rolled back on every machine
        assert cycle.status == "rolled_back" and "did not fall" in cycle.metrics["reasons"][0]
        assert len(cycle.curves["loss"]) == 3 and all(not math.isnan(v) for v in cycle.curves["loss"])
        played = {e.id for e in store.episodes(summary.run_id, limit=100)}
        assert cycle.episode_ids and set(cycle.episode_ids) <= played, "the adapter's training set is recorded"
        assert cycle.metrics["heldout_kl"]["before"] >= 0 and cycle.metrics["decision"] == cycle.status
        assert cycle.metrics["reasons"]
        adapter = store.get_adapter(cycle.adapter_id)
        assert (Path(adapter.path) / "adapter_config.json").is_file()
        conditions = {e.metrics["condition"] for e in store.evaluations(summary.run_id, cycle_id=cycle.id)}
        assert conditions == {
            "random",
            "teacher_with_lessons",
            "teacher_without_lessons",
            "student_with_lessons",
            "student_without_lessons",
            "validation_parent",
            "validation_student",
            "validation_parent_with_lessons",  # the promotion's no-regression check with lessons, on validation games
            "validation_student_with_lessons",
        }
        splits = {e.metrics["condition"]: e.split for e in store.evaluations(summary.run_id, cycle_id=cycle.id)}
        assert splits["validation_student"] == "validation" and splits["student_without_lessons"] == "eval"
        assert splits["validation_student_with_lessons"] == "validation"
        assert cycle.metrics["objective"] == "choice"  # the agent chose among admissible actions
        table = learning_table(store, summary.run_id)
        for label in (
            "random admissible action",
            "base model, no lessons",
            "base model + lessons in context",
            "consolidated adapter, no lessons",
            "McNemar p=",
            "95% CI",
        ):
            assert label in table
        if cycle.status == "promoted":
            assert adapter.status == "active" and summary.adapter == adapter.name
        else:
            assert adapter.status == "rejected"


@pytest.mark.slow
def test_a_cycle_with_validation_stores_its_curve_and_the_step_it_kept(tmp_path, cycle_config):
    trainer = {
        "steps": 3,
        "batch_size": 2,
        "max_new_tokens": 6,
        "lr": 1e-3,
        "k": 16,
        "lora_r": 4,
        "sampler": "live",
        "validation_fraction": 0.3,
        "min_improvement": 0.0,
    }
    loop = AgentLoop(cycle_config(trainer=trainer), tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        [cycle] = store.cycles(summary.run_id)
        training = cycle.metrics["training"]
        assert [v["step"] for v in training["validation"]] == [0, 1, 2, 3]
        assert [step for step, _ in cycle.curves["val_kl"]] == [1, 2, 3]  # one point per step, after it
        assert [v for _, v in cycle.curves["val_kl"]] == [v["val_kl"] for v in training["validation"][1:]]
        best = min(training["validation"], key=lambda v: v["val_kl"])
        assert training["best_step"] == best["step"] and not training["stopped_early"]
        assert len(cycle.curves["lr"]) == 3
        from distill.opcd import read_metadata

        assert read_metadata(store.get_adapter(cycle.adapter_id).path)["best_step"] == best["step"]


@pytest.mark.slow
def test_a_cycle_with_anchor_envs_keeps_the_parent_there(tmp_path, cycle_config, games_dir, monkeypatch):
    """`opcd.anchor_envs`: the parent plays that env's train games without lessons before the cycle trains, and their
    turns go to the trainer as anchor prompts (no context: the parent teaches there), not into the run's memory."""
    from agent_runtime.phases import consolidate

    jobs, real = [], consolidate.run_job

    def capturing(job, **kwargs):
        jobs.append(job)
        return real(job, **kwargs)

    monkeypatch.setattr(consolidate, "run_job", capturing)
    anchor = {
        "id": "textworld/coin_collector",
        "max_steps": 2,
        "kwargs": {"level": 2, "n_train": 2, "n_eval": 2, "cache_dir": str(games_dir)},
    }
    loop = AgentLoop(cycle_config(anchor_envs=[anchor], anchor_episodes=2), tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    [job] = jobs
    assert 2 <= len(job.anchor_prompts) <= 4 and len(job.anchor_choices) == len(job.anchor_prompts)
    for chat, actions in zip(job.anchor_prompts, job.anchor_choices):
        text = " ".join(m["content"] for m in chat)
        assert "Lessons" not in text and actions and all(a in text for a in actions)
    assert any(a.startswith("go ") for actions in job.anchor_choices for a in actions)  # level 2: an exit to take
    with ExperienceStore.open(tmp_path) as store:
        [cycle] = store.cycles(summary.run_id)
        assert cycle.metrics["anchor_prompts"] == len(job.anchor_prompts)
        assert store.count_episodes(summary.run_id) == 4  # the anchor games are not experience


@pytest.mark.slow
def test_interrupted_cycle_is_rolled_back_on_resume(tmp_path, cycle_config):
    cfg = cycle_config()
    loop = AgentLoop(cfg, tmp_path, progress=False)
    loop.close()
    with ExperienceStore.open(tmp_path) as store:  # as if the process died inside CONSOLIDATE
        [run] = store.runs()
        stale = store.start_cycle(run.id, {})
        store.update_run(run.id, phase="CONSOLIDATE")
    partial = tmp_path / "adapters" / ".cycle-9.partial-abc"  # what SIGKILL during an adapter save leaves
    partial.mkdir(parents=True)
    loop = AgentLoop(cfg, tmp_path, resume=True, progress=False)
    summary = loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        assert store.get_cycle(stale).status == "rolled_back" and "interrupted" in store.get_cycle(stale).error
        assert len(store.cycles(run.id)) == 2  # the fresh cycle ran
    assert summary.episodes == 4 and not partial.exists()


@pytest.mark.slow
def test_distill_and_eval_commands(tmp_path, cycle_config, cli):
    import json

    import yaml

    data = cycle_config().model_dump(mode="json")
    data["opcd"]["enabled"] = False  # the loop only plays and extracts; `distill` runs the cycle
    path = tmp_path / "cycle.yaml"
    path.write_text(yaml.safe_dump(data))
    workdir = tmp_path / "w"
    proc = cli("distill", path, "--workdir", workdir, check=False)
    assert proc.returncode == 2 and "play some episodes first" in proc.stderr
    run = cli("run", path, "--workdir", workdir, "--no-progress")
    assert "Loading weights" not in run.stderr and "it/s]" not in run.stderr  # no library's progress bar either
    report = json.loads(cli("distill", path, "--workdir", workdir, "--json").stdout)
    assert report["status"] == "rolled_back" and report["adapter_id"] is not None  # as test_cycle_in_the_loop
    assert set(report["metrics"]["evaluation"]) >= {"student_without_lessons", "teacher_with_lessons"}
    rows = json.loads(cli("eval", path, "--workdir", workdir, "--adapter", report["adapter_id"], "--json").stdout)
    [row] = rows
    assert row["env_id"] == "textworld/coin_collector" and row["episodes"] == 2
    lo, hi = row["ci95"]
    assert 0.0 <= lo <= row["success_rate"] <= hi <= 1.0
    text = cli("eval", path, "--workdir", workdir, "--no-lessons").stdout
    assert "95% CI" in text
    # the check it ran: the held-out tasks against what the run learned from
    assert "leak check: 2 held-out tasks" in text and "no live lesson and no acting adapter learned from one" in text


@pytest.mark.slow
def test_cycle_trains_data_parallel(tmp_path, cycle_config):
    """opcd.trainer.processes: 2 runs the cycle's training as two data-parallel ranks (gloo on CPU); the cycle
    row gets its curves step by step from rank 0 and the adapter is written once."""
    cfg = cycle_config()
    cfg.opcd.trainer = cfg.opcd.trainer.model_copy(update={"processes": 2})
    loop = AgentLoop(cfg, tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.cycles == 1
    with ExperienceStore.open(tmp_path) as store:
        [cycle] = store.cycles(summary.run_id)
        assert cycle.metrics["processes"] == 2 and len(cycle.curves["loss"]) == 3
        assert cycle.metrics["heldout_kl"]["after"] >= 0
        adapter = store.get_adapter(cycle.adapter_id)
    written = [p.name for p in (tmp_path / "adapters").iterdir()]
    assert written == [Path(adapter.path).name] and (Path(adapter.path) / "adapter_config.json").is_file()


def test_an_engine_that_can_sleep_gives_its_memory_back_while_a_cycle_trains():
    """`making_room`: sleep before the training, wake after it (an error included); an engine that cannot
    sleep (vLLM's CPU build) is left alone."""
    from agent_runtime.llm import making_room

    class Engine:
        def __init__(self, can: bool):
            self.can, self.calls = can, []

        def sleep(self) -> bool:
            self.calls.append("sleep")
            return self.can

        def wake_up(self) -> None:
            self.calls.append("wake")

    engine = Engine(True)
    with making_room(engine):
        engine.calls.append("train")
    assert engine.calls == ["sleep", "train", "wake"]
    engine = Engine(True)
    with pytest.raises(RuntimeError), making_room(engine):
        raise RuntimeError("diverged")
    assert engine.calls == ["sleep", "wake"]
    engine = Engine(False)
    with making_room(engine):
        pass
    assert engine.calls == ["sleep"]
    with making_room(object()):  # a backend without the capability
        pass


def test_making_room_hands_the_prefix_stores_memory_back_to_the_system():
    """The store's KV is many tensors under a megabyte, between allocations that live on: freed, glibc keeps their
    pages in its heap until it is asked to trim it (it trims only the heap's free top by itself); `making_room`
    asks."""
    import ctypes.util
    import os

    import torch

    from agent_runtime.llm import making_room

    if not ctypes.util.find_library("c") or not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim"):
        pytest.skip("glibc's malloc_trim is not here")

    def resident_mb() -> float:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    pins = []

    class Store:
        def __init__(self):
            self.kept = []
            for _ in range(2_000):  # 200 MB in 100 KB tensors, each followed by one that lives on
                self.kept.append(torch.ones(25_000))
                pins.append(torch.ones(16))

        def clear(self):
            self.kept.clear()

    class Backend:
        prefix_kv = Store()

    before = resident_mb()
    with making_room(Backend()):
        during = resident_mb()
    assert before - during > 150, (before, during)
    assert len(pins) == 2_000


def test_a_promoted_cycle_consolidates_only_the_lessons_it_internalised():
    from agent_runtime.config import ConsolidationConfig
    from agent_runtime.phases.promotion import internalized_lessons

    settings = ConsolidationConfig(internalized_ratio=0.5, promote_margin=0.1)
    before, after = {1: 0.4, 2: 0.4, 3: 0.0}, {1: 0.2, 2: 0.21, 3: 0.0}
    rates = {"student_without_lessons": 0.6, "teacher_with_lessons": 0.7}
    assert internalized_lessons(before, after, rates, settings) == [1, 3], "KL at half its start, or nothing to move"
    rates["student_without_lessons"] = 0.59
    assert internalized_lessons(before, after, rates, settings) == [], "the student without them falls short"


def test_cycle_prompts_are_choices_when_there_are_any_in_a_seeded_order_with_a_tenth_held_out():
    from agent_runtime.phases.consolidate import choose_prompts, split_heldout
    from agent_runtime.phases.turn_prompts import Decision

    free = [Decision([{"role": "user", "content": f"free {i}"}], [i]) for i in range(5)]
    choice = [Decision([{"role": "user", "content": f"choice {i}"}], [i], ["a", "b"]) for i in range(30)]
    chosen = choose_prompts(free + choice, cycle_id=7, limit=25)
    assert len(chosen) == 25 and all(d.choices for d in chosen) and chosen == choose_prompts(choice, 7, 25)
    assert chosen != choose_prompts(choice, 8, 25), "another cycle, another order"
    assert choose_prompts(free, 7, 25) != free and sorted(choose_prompts(free, 7, 25), key=str) == sorted(free, key=str)
    heldout, train = split_heldout(chosen)
    assert (len(heldout), len(train)) == (2, 23) and heldout + train == chosen
    assert split_heldout(free[:1]) == (free[:1], free[:1]), "one decision is both held out and trained on"


def test_a_cycle_with_nothing_to_consolidate_is_a_skipped_report_that_moves_the_cursor(tmp_path, cycle_config):
    """No live lessons: no cycle row, a "skipped" report, and the cursor's move written by the cycle itself, with
    the state meant for a phase that did nothing (no cycle counted) and the run requests it carried out."""
    from agent_runtime.phases.consolidate import run_cycle
    from agent_runtime.state import Run
    from agent_runtime.state.cursor import CursorMove
    from distill.lessons.forget import RECONSOLIDATE

    config = cycle_config()
    with ExperienceStore.open(tmp_path) as store:
        run_id = store.create_run(config.name, config.model_dump(mode="json"))
        asked = store.add_request(run_id, RECONSOLIDATE, {"reason": "a test"})
        finish = CursorMove(
            "PLAY", {"episodes": 4, "cycles": 1}, (asked,), state_if_skipped={"episodes": 4, "cycles": 0}
        )
        report = run_cycle(Run(config, tmp_path, store, run_id), None, finish=finish)
        assert (report.status, report.cycle_id, report.adapter_id) == ("skipped", None, None)
        assert report.line() == "CONSOLIDATE: no live lessons; nothing to consolidate"
        run = store.get_run(run_id)
        assert (run.phase, run.state) == ("PLAY", {"episodes": 4, "cycles": 0})
        assert store.cycles(run_id) == [] and store.requests(run_id, kind=RECONSOLIDATE, pending=True) == []


class _Adapters:
    """The adapter capability alone: loads and switches by name (what `acting` drives)."""

    def __init__(self):
        self.adapters, self.active_adapter, self.loads = {}, None, []

    def load_adapter(self, name, path):
        self.adapters[name], self.active_adapter = str(path), name
        self.loads.append(name)

    def use_adapter(self, name):
        assert name is None or name in self.adapters
        self.active_adapter = name


def test_acting_switches_for_the_block_and_restores_what_was_in_use_even_on_error():
    from agent_runtime.llm.base import acting, activate

    AdapterFiles = namedtuple("AdapterFiles", "name path")  # what the store's AdapterInfo offers

    backend = _Adapters()
    activate(backend, AdapterFiles("parent", "/a/parent"))
    with acting(backend, AdapterFiles("candidate", "/a/candidate")):
        assert backend.active_adapter == "candidate"
        with acting(backend, None):
            assert backend.active_adapter is None, "None acts with the base model"
        assert backend.active_adapter == "candidate"
    assert backend.active_adapter == "parent" and backend.loads == ["parent", "candidate"]
    with pytest.raises(RuntimeError), acting(backend, AdapterFiles("candidate", "/a/candidate")):
        raise RuntimeError("an evaluation failed")
    assert backend.active_adapter == "parent" and backend.loads == ["parent", "candidate"], "loaded once"
    plain = object()  # a backend without adapters acts with the base model anyway
    with acting(plain, None) as inside:
        assert inside is plain
