"""The same config with `backend: vllm` consolidates too: the loop plays on vLLM (here its CPU build, in its own
environment), an OPCD cycle trains next to it on the config's device, EVALUATE plays the parent and the new
adapter through the engine (LoRA hot-swapped), and a promoted adapter is what the next episodes are played
with. Skips without the vLLM environment, like tests/agent_runtime/llm/test_vllm.py."""

from __future__ import annotations

import pytest

from agent_runtime.config import config_from_dict
from agent_runtime.run.loop import AgentLoop
from memory import ExperienceStore

LESSON = "When you see a coin, take coin at once."


@pytest.mark.slow
def test_a_cycle_on_the_vllm_backend(tmp_path, games_dir, vllm_python, smollm2):
    config = config_from_dict(
        {
            "name": "vllm-cycle",
            "model": {
                "name": smollm2,
                "backend": "vllm",
                "dtype": "float32",
                "context_window": 2048,
                "max_new_tokens": 8,
                "options": {"python": vllm_python, "max_lora_rank": 8, "log_file": str(tmp_path / "vllm.log")},
            },
            "envs": [
                {
                    "id": "textworld/coin_collector",
                    "max_steps": 1,
                    "kwargs": {"level": 1, "n_train": 4, "n_eval": 1, "cache_dir": str(games_dir)},
                }
            ],
            "runtime": {"slots": 2, "episodes": 6},
            "evaluation": {"episodes_per_env": 1},
            "lessons": {
                "enabled": True,
                "extract_every": 10_000,
                "gate_episodes": 0,
                "embedder": "hash",
                "seed": [LESSON],
            },
            "opcd": {
                "enabled": True,
                "consolidate_every": 4,
                "recent_episodes": 4,
                "promote_margin": 1.0,
                "retention_margin": 1.0,
                "min_kl_drop": 0.0,
                # no step: the adapter is the parent (a fresh LoRA is zero), so the promotion is certain and the
                # test is about what vLLM must do around a cycle, not about learning (tests/distill/opcd/)
                "trainer": {
                    "steps": 0,
                    "batch_size": 2,
                    "lr": 2e-4,
                    "lora_r": 8,
                    "lora_alpha": 16,
                    "sampler": "live",
                    "gradient_checkpointing": False,
                },
            },
        }
    )
    loop = AgentLoop(config, tmp_path / "run", progress=False)
    summary = loop.run()
    loaded = loop.backend.loaded_adapters()
    loop.close()
    assert summary.cycles == 1 and summary.episodes == 6
    with ExperienceStore.open(tmp_path / "run") as store:
        [cycle, *_] = store.cycles(summary.run_id)
        assert cycle.status == "promoted" and cycle.metrics["objective"] == "choice"
        assert set(cycle.metrics["evaluation"]) >= {"teacher_with_lessons", "student_without_lessons"}
        after = [e for e in store.episodes(summary.run_id, limit=100) if e.metadata["draw"] >= 4]
    assert after and all(e.adapter_id == cycle.adapter_id for e in after), "played with the promoted adapter"
    assert loaded, "the engine holds the cycle's adapter"
