"""`runtime.executor: ray` on a local Ray cluster: two rollout workers, the driver the only writer.

A worker killed mid-run has its in-flight draws played by the other worker and every draw is committed
exactly once (SQLite and PostgreSQL); a driver stopped mid-run resumes on fresh workers without losing or
repeating a draw; the tiny model acts on the workers and a promoted adapter reaches them by path.
"""

from __future__ import annotations

import pytest

from agent_runtime.config import ConfigError, config_from_dict
from agent_runtime.run.loop import AgentLoop
from memory import ExperienceStore

ray = pytest.importorskip("ray")


def make_config(games_dir, *, episodes=12, workers=2, slots=2, model=None, memory_url=None, envs=None, **ray_opts):
    data = {
        "name": "t",
        "model": model or {"name": "scripted", "backend": "scripted"},
        "envs": envs
        or [
            {
                "id": "textworld/coin_collector",
                "max_steps": 4,
                "kwargs": {"level": 1, "n_train": 4, "cache_dir": str(games_dir)},
            }
        ],
        "runtime": {
            "slots": 1,
            "episodes": episodes,
            "executor": "ray",
            "summary_every": 1000,
            "ray": {"workers": workers, "slots": slots, "worker_cpus": 0.5, **ray_opts},
        },
    }
    if memory_url is not None:
        data["memory"] = {"url": memory_url}
    return config_from_dict(data)


def after_commits(loop, n, action):
    """Call `action(loop)` once, right after the n-th episode is committed (in the driver's commit path)."""
    add_episode = loop.store.add_episode
    count = {"n": 0}

    def wrapped(*args, **kwargs):
        episode_id = add_episode(*args, **kwargs)
        count["n"] += 1
        if count["n"] == n:
            action(loop)
        return episode_id

    loop.store.add_episode = wrapped


def committed(store, run_id):
    return [(e.metadata["draw"], e.metadata.get("worker")) for e in store.episodes(run_id, limit=10_000)]


def test_unknown_model_fails_on_the_driver_before_any_worker_starts(tmp_path, games_dir):
    from agent_runtime.checkpoints import UnknownModelError

    config = make_config(games_dir, model={"name": "no-such-model"})
    with pytest.raises(UnknownModelError, match="unknown model 'no-such-model'"):
        AgentLoop(config, tmp_path, progress=False)


def test_the_learner_takes_a_gpu_when_the_cluster_has_a_free_one():
    from agent_runtime.run.ray_executor import learner_gpus

    settings = config_from_dict(
        {"name": "t", "envs": [{"id": "math/gsm_symbolic"}], "runtime": {"executor": "ray", "ray": {"workers": 2}}}
    ).runtime.ray
    assert learner_gpus(settings, {"CPU": 8}) == 0
    assert learner_gpus(settings, {"CPU": 8, "GPU": 1}) == 1
    settings.worker_gpus = 0.5
    assert learner_gpus(settings, {"CPU": 8, "GPU": 1}) == 0  # the workers claim it
    assert learner_gpus(settings, {"CPU": 8, "GPU": 3}) == 1
    settings.learner_gpus = 2
    assert learner_gpus(settings, {"CPU": 8, "GPU": 3}) == 2


def test_the_learner_trains_one_rank_per_gpu_on_its_device():
    from agent_runtime.run.ray_executor import learner_config

    config = config_from_dict(
        {
            "name": "t",
            "envs": [{"id": "math/gsm_symbolic"}],
            "runtime": {"executor": "ray", "ray": {"learner_device": "cuda"}},
        }
    )
    assert learner_config(config, 4)["opcd"]["trainer"]["processes"] == 4
    assert learner_config(config, 1)["opcd"]["trainer"]["processes"] == 1
    assert learner_config(config, 4)["model"]["device"] == "cuda" and config.model.device == "cpu"
    config.opcd.trainer.processes = 2  # configured explicitly: kept
    assert learner_config(config, 4)["opcd"]["trainer"]["processes"] == 2


def test_ray_settings_are_validated():
    base = {"name": "t", "envs": [{"id": "math/gsm_symbolic"}], "runtime": {"executor": "ray"}}
    assert config_from_dict(base).runtime.ray.workers == 2
    with pytest.raises(ConfigError, match="generation: server needs `server:`"):
        config_from_dict({**base, "runtime": {"executor": "ray", "ray": {"generation": "server"}}})
    with pytest.raises(ConfigError, match="runtime.ray.wrokers: unknown key; accepted: address, generation"):
        config_from_dict({**base, "runtime": {"executor": "ray", "ray": {"wrokers": 2}}})


@pytest.mark.slow
def test_killed_worker_draws_are_replayed_once(ray_cluster, tmp_path, games_dir, memory_url):
    config = make_config(games_dir, memory_url=memory_url, replace_workers=0)
    loop = AgentLoop(config, tmp_path / "run", progress=False)
    after_commits(loop, 3, lambda loop: ray.kill(loop.executor.workers[0]))
    summary = loop.run()
    dead, requeued = list(loop.executor.dead), list(loop.executor.requeued)
    loop.close()
    assert summary.episodes == 12 and dead == [0]
    assert requeued, "worker 0 had episodes in flight when it died"
    with ExperienceStore.open(memory_url) as store:
        [run] = store.runs()
        assert run.status == "finished" and run.state["open_draws"] == [] and run.state["next_draw"] == 12
        rows = committed(store, run.id)
    assert sorted(d for d, _ in rows) == list(range(12)), "every draw committed exactly once"
    by_draw = dict(rows)
    assert all(by_draw[d] == 1 for d in requeued), "the orphaned draws were replayed by worker 1"
    # (which worker the first 3 commits came from depends on timing, so it is not asserted)


@pytest.mark.slow
def test_driver_stopped_then_resumed_on_fresh_workers(ray_cluster, tmp_path, games_dir):
    loop = AgentLoop(make_config(games_dir, episodes=10), tmp_path, progress=False)
    after_commits(loop, 4, lambda loop: loop.request_stop())
    first = loop.run()
    loop.close()
    assert first.stopped_by_signal and 4 <= first.episodes < 10
    with ExperienceStore.open(tmp_path) as store:
        [run] = store.runs()
        assert run.status == "stopped"
        open_draws = run.state["open_draws"]
        done = [d for d, _ in committed(store, run.id)]
        assert open_draws and not set(done) & set(open_draws)
        assert sorted(done + open_draws) == list(range(run.state["next_draw"]))

    loop = AgentLoop(make_config(games_dir, episodes=10), tmp_path, resume=True, progress=False)
    second = loop.run()
    loop.close()
    assert second.run_id == first.run_id and second.episodes == 10
    with ExperienceStore.open(tmp_path) as store:
        assert sorted(d for d, _ in committed(store, first.run_id)) == list(range(10))


@pytest.mark.slow
def test_tiny_model_on_workers_and_adapter_broadcast(ray_cluster, tmp_path, games_dir, tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from agent_runtime.testing import tiny_model_and_tokenizer

    # math, not TextWorld: a random model's free text can contain dumb-frotz meta-commands ("\\...") that hang it
    model = {"name": str(tiny_model_dir), "max_new_tokens": 6}
    config = make_config(games_dir, episodes=2, slots=1, model=model, envs=[{"id": "math/gsm_symbolic"}])
    loop = AgentLoop(config, tmp_path, progress=False)
    first = loop.run()
    assert first.episodes == 2 and first.completion_tokens > 0  # the workers' tokens reach the summary

    base, _ = tiny_model_and_tokenizer()
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    adapter_id = loop.store.add_adapter("cycle-1", str(tmp_path / "adapter"), run_id=loop.run_id, status="active")
    loop.adapter = loop.store.active_adapter(loop.run_id)  # what PROMOTE does
    loop.config.runtime.episodes = 4
    second = loop.run()
    loop.close()
    assert second.episodes == 4
    with ExperienceStore.open(tmp_path) as store:
        episodes = sorted(store.episodes(first.run_id), key=lambda e: e.metadata["draw"])
    assert [e.metadata["draw"] for e in episodes] == [0, 1, 2, 3]
    assert all(e.policy == str(tiny_model_dir) and e.completion_tokens > 0 for e in episodes)
    assert [e.adapter_id for e in episodes] == [None, None, adapter_id, adapter_id]


@pytest.mark.slow
def test_workers_the_cluster_cannot_place_fail_at_once(ray_cluster, tmp_path, games_dir):
    config = make_config(games_dir, workers=8)  # 8 x 0.5 CPU on a 2-CPU cluster
    loop = AgentLoop(config, tmp_path, progress=False)
    with pytest.raises(ConfigError, match=r"8 workers x 0.5 CPU = 4 CPUs, but the Ray cluster has 2"):
        loop.run()
    loop.close()


@pytest.mark.slow
def test_all_workers_lost_then_resume_commits_each_draw_once(ray_cluster, tmp_path, games_dir):
    from agent_runtime.run.ray_executor import NoWorkersLeftError

    loop = AgentLoop(make_config(games_dir, episodes=10, replace_workers=0), tmp_path, progress=False)
    after_commits(loop, 2, lambda loop: [ray.kill(w) for w in loop.executor.workers.values()])
    with pytest.raises(NoWorkersLeftError, match="all rollout workers died"):
        loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        [run] = store.runs()
        assert run.status == "stopped" and run.state["open_draws"]
    loop = AgentLoop(make_config(games_dir, episodes=10), tmp_path, resume=True, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.episodes == 10
    with ExperienceStore.open(tmp_path) as store:
        episodes = store.episodes(summary.run_id, limit=100)
    assert sorted(e.metadata["draw"] for e in episodes) == list(range(10))
    lost = [e for e in episodes if e.metadata.get("lost")]
    assert all(e.outcome == "error" and e.error.startswith("lost: in flight on 2") for e in lost)
    assert summary.errors == len(lost)


@pytest.mark.slow
def test_generation_server_gives_workers_the_chat_backend(ray_cluster, tmp_path, games_dir):
    """`generation: server`: the workers talk to a chat model (a vLLM server in production, a fake one here)
    while the driver keeps the configured `model` for the phases it runs."""
    config = make_config(games_dir, episodes=4, envs=[{"id": "math/gsm_symbolic"}])
    config.runtime.ray.server = {
        "class": "langchain_core.language_models.fake_chat_models:FakeListChatModel",
        "kwargs": {"responses": ["The answer is \\boxed{-1}."]},
    }
    config.runtime.ray.generation = "server"
    loop = AgentLoop(config, tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.episodes == 4
    with ExperienceStore.open(tmp_path) as store:
        episodes = [store.episode(e.id) for e in store.episodes(summary.run_id)]
    assert all(e.outcome == "lost" and e.steps[0].response == "The answer is \\boxed{-1}." for e in episodes)


@pytest.mark.slow
def test_dead_workers_are_replaced_and_the_fresh_ones_play(ray_cluster, tmp_path, games_dir):
    loop = AgentLoop(make_config(games_dir, episodes=12), tmp_path, progress=False)
    after_commits(loop, 3, lambda loop: [ray.kill(w) for w in list(loop.executor.workers.values())])
    summary = loop.run()
    dead, replaced = list(loop.executor.dead), list(loop.executor.replaced)
    loop.close()
    assert summary.episodes == 12 and sorted(dead) == [0, 1] and replaced == [2, 3]
    with ExperienceStore.open(tmp_path) as store:
        rows = committed(store, summary.run_id)
    assert sorted(d for d, _ in rows) == list(range(12)), "every draw committed exactly once"
    workers = [w for _, w in rows]  # (records the dead workers returned before the kill are still committed)
    assert set(workers) <= {0, 1, 2, 3} and workers.count(2) + workers.count(3) >= 12 - 6, "the fresh ones played"


@pytest.mark.slow
def test_generation_server_gets_the_promoted_adapter(ray_cluster, tmp_path, games_dir):
    """`generation: server` with a promoted adapter: each worker has the (fake) vLLM server load it by path
    and then asks for it by name; the server loads it once."""
    from agent_runtime.llm.fake_chat import LoraEndpoint

    endpoint = LoraEndpoint()
    config = make_config(games_dir, episodes=2, slots=1, envs=[{"id": "math/gsm_symbolic"}])
    config.runtime.ray.server = {
        "class": "agent_runtime.llm.fake_chat:ServedModelChat",
        "kwargs": {"model": "base", "base_url": endpoint.url},
    }
    config.runtime.ray.generation = "server"
    loop = AgentLoop(config, tmp_path, progress=False)
    loop.run()
    adapter = tmp_path / "adapters" / "cycle-1"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    adapter_id = loop.store.add_adapter("cycle-1", str(adapter), run_id=loop.run_id, status="active")
    loop.adapter = loop.store.active_adapter(loop.run_id)  # what PROMOTE does
    loop.config.runtime.episodes = 4
    summary = loop.run()
    loop.close()
    endpoint.close()
    assert endpoint.loaded == {"cycle-1": str(adapter)}
    loads = [r["lora_name"] for r in endpoint.requests if r["path"] == "/v1/load_lora_adapter"]
    assert loads == ["cycle-1", "cycle-1"]  # one per worker; the second finds it served from the same files
    with ExperienceStore.open(tmp_path) as store:
        episodes = sorted(
            (store.episode(e.id) for e in store.episodes(summary.run_id)), key=lambda e: e.metadata["draw"]
        )
    assert [e.steps[0].response.split()[-1] for e in episodes] == ["base", "base", "cycle-1", "cycle-1"]
    assert [e.adapter_id for e in episodes] == [None, None, adapter_id, adapter_id]


def learner_config(cycle_config, memory_url=None, **ray_opts):
    data = cycle_config().model_dump(mode="json")
    if memory_url is not None:
        data["memory"] = {"url": memory_url}
    data["runtime"] = {
        "slots": 1,
        "episodes": 4,
        "executor": "ray",
        "summary_every": 1000,
        "ray": {"workers": 1, "slots": 2, "worker_cpus": 0.5, "learner_cpus": 0.5, **ray_opts},
    }
    return config_from_dict(data)


@pytest.mark.slow
def test_extract_and_consolidate_run_on_the_learner(ray_cluster, tmp_path, cycle_config, memory_url):
    import os

    loop = AgentLoop(learner_config(cycle_config, memory_url), tmp_path, progress=False)
    summary = loop.run()
    lost, driver_model = loop.executor.learners_lost, loop._backend
    loop.close()
    assert summary.episodes == 4 and summary.extractions == 2 and summary.cycles == 1 and lost == 0
    assert driver_model is None, "the driver neither plays nor learns, so it never loads the model"
    with ExperienceStore.open(memory_url) as store:
        [cycle] = store.cycles(summary.run_id)
        # the same decision as the local loop's (test_consolidate.test_cycle_in_the_loop)
        assert cycle.status == "rolled_back" and len(cycle.curves["loss"]) == 3
        where = cycle.metrics["learner"]
        assert where["pid"] != os.getpid() and where["device"] == "cpu"
        assert store.lessons(summary.run_id), "the learner's extractions reached the shared store"
        assert summary.adapter is None


@pytest.mark.slow
def test_learner_killed_mid_cycle_is_replaced_and_the_cycle_rerun(ray_cluster, tmp_path, cycle_config):
    loop = AgentLoop(learner_config(cycle_config), tmp_path, progress=False)
    executor = loop.executor
    killed = []

    def kill_once_a_cycle_runs() -> None:
        if not killed and loop.store.cycles(loop.run_id, status="running"):
            killed.append(True)
            ray.kill(executor.learner)

    executor.poll_hooks.append(kill_once_a_cycle_runs)
    summary = loop.run()
    lost = executor.learners_lost
    loop.close()
    assert killed and lost == 1 and summary.cycles == 1 and summary.episodes == 4
    with ExperienceStore.open(tmp_path) as store:
        first, second = store.cycles(summary.run_id)
    assert first.status == "rolled_back" and "learner died" in first.error
    assert second.status == "rolled_back" and len(second.curves["loss"]) == 3


@pytest.mark.slow
def test_a_failed_commit_on_the_driver_leaves_the_draw_open(ray_cluster, tmp_path, games_dir):
    """The Ray executor commits through the same play session as the local loop: the state never counts an
    episode that is not stored, and the resumed run replays the draw whose commit failed, once."""
    loop = AgentLoop(make_config(games_dir, episodes=8), tmp_path, progress=False)
    add_episode, count = loop.store.add_episode, {"n": 0}

    def failing(*args, **kwargs):
        count["n"] += 1
        if count["n"] == 3:
            raise OSError("disk full")
        return add_episode(*args, **kwargs)

    loop.store.add_episode = failing
    with pytest.raises(OSError, match="disk full"):
        loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        [run] = store.runs()
        done = [d for d, _ in committed(store, run.id)]
        assert run.state["episodes"] == len(done) == 2
        assert not set(done) & set(run.state["open_draws"])
        assert sorted(done + run.state["open_draws"]) == list(range(run.state["next_draw"]))
    loop = AgentLoop(make_config(games_dir, episodes=8), tmp_path, resume=True, progress=False)
    assert loop.run().episodes == 8
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        assert sorted(d for d, _ in committed(store, run.id)) == list(range(8))
