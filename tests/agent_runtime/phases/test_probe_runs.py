"""The adapter probe where runs use it: after a promotion in the loop, and after the Ray driver hands an adapter to
its rollout workers; and the fingerprint every episode records of the weights its backend had loaded.

The loop's cycle is real: a tiny model first taught (plain SFT, in the test) to take the coin when a lesson says
so, then a run whose OPCD cycle consolidates that lesson and is promoted. The stale backend is the real
transformers backend behind a wrapper whose adapter switches never reach the model. On Ray, the workers load the
adapter by path; a stale worker is one that finds other files there than the trainer wrote (the files changed
after the probe's reference was taken).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from agent_runtime.config import config_from_dict
from agent_runtime.llm.transformers_backend import TransformersBackend
from agent_runtime.phases.probe import StaleAdapterError, ensure_reference
from agent_runtime.run.loop import AgentLoop
from agent_runtime.state import Run
from agent_runtime.testing import StaleAdapterBackend
from memory import ExperienceStore
from modelkit.fingerprint import fingerprint_files

LOOP_WHERE = "the loop's transformers backend"


@pytest.mark.slow
def test_the_loop_probes_its_backend_after_a_promotion(tmp_path, coin_lesson_model, coin_lesson_config):
    loop = AgentLoop(coin_lesson_config("probe", coin_lesson_model, 12), tmp_path, progress=False)
    summary = loop.run()
    loop.close()
    assert summary.cycles == 1 and summary.adapter == "cycle-1", "the cycle was promoted"
    with ExperienceStore.open(tmp_path) as store:
        [cycle] = store.cycles(summary.run_id)
        adapter = store.get_adapter(cycle.adapter_id)
        probe = cycle.metrics["probe"]
        episodes = sorted(store.episodes(summary.run_id, limit=100), key=lambda e: e.metadata["draw"])
    reference, result = probe["reference"], probe["results"][LOOP_WHERE]
    assert reference["adapter"] == "cycle-1" and reference["parent"] is None and len(reference["prompts"]) >= 1
    assert result["verdict"] == "adapter" and result["mode"] == "choice" and result["to_adapter"] < 1e-3
    assert result["shift"] > 2 * result["tolerance"], "the adapter moved the probe: the verdict means something"
    assert adapter.fingerprint == fingerprint_files(adapter.path) == result["fingerprint"]
    assert [e.adapter_fingerprint for e in episodes[:8]] == [None] * 8, "the base model played before the cycle"
    assert [(e.adapter_id, e.adapter_fingerprint) for e in episodes[8:]] == [(adapter.id, adapter.fingerprint)] * 4


@pytest.mark.slow
def test_a_backend_that_keeps_the_old_weights_stops_the_run(tmp_path, coin_lesson_model, coin_lesson_config):
    stale = StaleAdapterBackend(TransformersBackend.from_pretrained(str(coin_lesson_model), dtype="float32"))
    loop = AgentLoop(coin_lesson_config("probe", coin_lesson_model, 12), tmp_path, backend=stale, progress=False)
    with pytest.raises(
        StaleAdapterError,
        match=f"{LOOP_WHERE} does not act with adapter cycle-1 after its promotion: it acts as the parent",
    ):
        loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        [run] = store.runs()
        [cycle] = store.cycles(run.id)
        result = cycle.metrics["probe"]["results"][LOOP_WHERE]
        episodes = store.episodes(run.id, limit=100)
    assert cycle.status == "promoted" and result["verdict"] == "stale" and run.status == "stopped"
    assert result["fingerprint"] is None, "the backend still acts with the base model's weights"
    assert len(episodes) == 8 and all(e.adapter_id is None for e in episodes), "no episode of the stale policy"


# -- Ray rollout workers -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def peaky_dir(tmp_path_factory):
    """The tiny model with its (tied) embeddings scaled 20x, so that a random adapter moves its choices far."""
    from agent_runtime.testing import tiny_model_and_tokenizer

    model, tokenizer = tiny_model_and_tokenizer()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20.0)
    directory = tmp_path_factory.mktemp("peaky")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _random_adapter(model_dir, path, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]),
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    lora.save_pretrained(path)
    return path


def _ray_config(model_dir, games_dir, episodes):
    return config_from_dict(
        {
            "name": "probe-ray",
            "model": {"name": str(model_dir), "max_new_tokens": 4, "dtype": "float32"},
            "agent": {"action_mode": "choice"},
            "envs": [
                {
                    "id": "textworld/coin_collector",
                    "max_steps": 2,
                    "kwargs": {"level": 1, "n_train": 4, "cache_dir": str(games_dir)},
                }
            ],
            "runtime": {
                "slots": 1,
                "episodes": episodes,
                "executor": "ray",
                "summary_every": 1000,
                "ray": {"workers": 2, "slots": 1, "worker_cpus": 0.5},
            },
        }
    )


@pytest.mark.slow
def test_ray_workers_are_probed_and_a_stale_one_stops_the_run(ray_cluster, tmp_path, games_dir, peaky_dir):
    loop = AgentLoop(_ray_config(peaky_dir, games_dir, 4), tmp_path, progress=False)
    first = loop.run()
    path = _random_adapter(peaky_dir, tmp_path / "adapters" / "cycle-1", seed=1)
    store = loop.store
    played = [e.id for e in store.episodes(first.run_id)]
    cycle = store.start_cycle(first.run_id, {}, episode_ids=played)  # what CONSOLIDATE and PROMOTE leave
    adapter_id = store.add_adapter("cycle-1", str(path), run_id=first.run_id, fingerprint=fingerprint_files(path))
    store.update_cycle(cycle, adapter_id=adapter_id)
    store.promote_cycle(cycle, [])
    adapter = store.get_adapter(adapter_id)
    reference = ensure_reference(
        Run(loop.config, tmp_path, store, first.run_id), adapter, loop.backend
    )  # the learner's
    assert reference.shift > 0.1, reference.shift
    loop.adapter = adapter
    loop.config.runtime.episodes = 8
    second = loop.run()
    loop.close()
    assert second.episodes == 8
    with ExperienceStore.open(tmp_path) as store:
        [cycle_info] = store.cycles(first.run_id)
        results = cycle_info.metrics["probe"]["results"]
        episodes = sorted(store.episodes(first.run_id, limit=100), key=lambda e: e.metadata["draw"])
    assert sorted(results) == ["rollout worker 0 (transformers backend)", "rollout worker 1 (transformers backend)"]
    assert all(r["verdict"] == "adapter" and r["fingerprint"] == adapter.fingerprint for r in results.values())
    assert [e.adapter_fingerprint for e in episodes[4:]] == [adapter.fingerprint] * 4, "the workers report it"

    shutil.rmtree(path)  # other weights at the adapter's path: what a worker started now loads
    _random_adapter(peaky_dir, path, seed=2)
    loop = AgentLoop(_ray_config(peaky_dir, games_dir, 12), tmp_path, resume=True, progress=False)
    with pytest.raises(
        StaleAdapterError,
        match=r"rollout worker \d \(transformers backend\) does not act with "
        "adapter cycle-1 after its promotion: it acts as neither",
    ):
        loop.run()
    loop.close()
    with ExperienceStore.open(tmp_path) as store:
        assert len(store.episodes(first.run_id, limit=100)) == 8, "the stale workers played nothing"
        [cycle_info] = store.cycles(first.run_id)
    stale = [r for r in cycle_info.metrics["probe"]["results"].values() if r["verdict"] == "stale"]
    assert len(stale) == 2 and all(r["fingerprint"] != adapter.fingerprint for r in stale)
