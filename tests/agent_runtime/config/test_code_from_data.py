"""A config is data: no class it names is called before it is checked, and a stored config (a run's own, or an
imported one) that names code the user's config does not is refused on `run --resume` before anything runs."""

from __future__ import annotations

import pytest

from agent_runtime.config import ConfigError, code_references, config_from_dict
from agent_runtime.llm.base import BackendError
from agent_runtime.llm.chat_backend import ChatBackend
from agent_runtime.run.loop import AgentLoop
from environments.registry import trusting_code
from memory import ExperienceStore


def popen_options(marker) -> dict:
    return {"class": "subprocess:Popen", "kwargs": {"args": ["touch", str(marker)]}}


def test_the_chat_backend_calls_no_class_that_is_not_a_chat_model(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(BackendError, match="subprocess:Popen is not a langchain-core BaseChatModel class"):
        ChatBackend.from_options(popen_options(marker))
    assert not marker.exists(), "the command ran"


def smoke(games_dir, **extra):
    return {
        "name": "t",
        "model": {"name": "scripted", "backend": "scripted"},
        "envs": [
            {
                "id": "textworld/coin_collector",
                "max_steps": 4,
                "kwargs": {"level": 1, "n_train": 4, "cache_dir": str(games_dir)},
            }
        ],
        "runtime": {"episodes": 2},
        **extra,
    }


def test_resume_refuses_a_stored_config_that_names_other_code(tmp_path, games_dir):
    """What `memory import` of someone's export followed by `run --resume` did: the stored config ran Popen."""
    marker = tmp_path / "ran"
    planted = smoke(games_dir, model={"name": "x", "backend": "chat", "options": popen_options(marker)})
    with ExperienceStore.open(tmp_path) as store:
        store.create_run("t", config_from_dict(planted).model_dump(mode="json"))
    with pytest.raises(ConfigError, match=r"model.options.class: stored 'subprocess:Popen', given None"):
        AgentLoop(config_from_dict(smoke(games_dir)), tmp_path, resume=True, progress=False)
    assert not marker.exists(), "the command ran"


def test_resume_goes_on_when_the_code_named_is_the_same(tmp_path, games_dir):
    envs = [{"id": "tests.agent_runtime.run.test_loop:LessonSensitiveEnv"}]
    loop = AgentLoop(config_from_dict(smoke(games_dir, envs=envs)), tmp_path, progress=False)
    loop.run()
    loop.close()
    again = smoke(games_dir, envs=envs, runtime={"episodes": 4})
    loop = AgentLoop(config_from_dict(again), tmp_path, resume=True, progress=False)
    assert loop.run().episodes == 4
    loop.close()
    other = smoke(games_dir, envs=[{"id": "tests.agent_runtime.run.test_loop:ExplodingEnv"}])
    with pytest.raises(ConfigError, match="envs.0.id: stored 'tests.agent_runtime.run.test_loop:LessonSensitiveEnv'"):
        AgentLoop(config_from_dict(other), tmp_path, resume=True, progress=False)


def test_resume_refuses_a_stored_interpreter_the_given_config_does_not_name(tmp_path, games_dir, tiny_model_dir):
    """An imported run whose config starts the vllm backend's engine with `model.options.python`: that path is
    a program the stored config would execute."""
    marker = tmp_path / "ran"
    program = tmp_path / "python"
    program.write_text(f"#!/bin/sh\ntouch {marker}\n")
    program.chmod(0o755)
    planted = smoke(
        games_dir, model={"name": str(tiny_model_dir), "backend": "vllm", "options": {"python": str(program)}}
    )
    with trusting_code(), ExperienceStore.open(tmp_path) as store:  # an export made by someone who trusted it
        store.create_run("t", config_from_dict(planted).model_dump(mode="json"))
    with pytest.raises(ConfigError, match=r"model.options: the vllm backend: python: '.*python' is a program"):
        AgentLoop(config_from_dict(smoke(games_dir)), tmp_path, resume=True, progress=False)
    with trusting_code(), pytest.raises(ConfigError, match=r"model.options.python: stored '.*python', given None"):
        AgentLoop(config_from_dict(smoke(games_dir)), tmp_path, resume=True, progress=False)
    assert not marker.exists(), "the program ran"


def test_every_code_naming_field_is_found():
    def config(model):
        return config_from_dict(
            {
                "name": "t",
                "envs": [{"id": "math/gsm_symbolic"}, {"id": "pkg.mod:Env"}],
                "model": model,
                "lessons": {"extractor": "c:D"},
                "runtime": {"executor": "ray", "ray": {"generation": "server", "server": {"class": "e:F"}}},
                "opcd": {"retention_envs": [{"id": "g:H"}]},
            }
        )

    rest = {
        "lessons.extractor": "c:D",
        "runtime.ray.server.class": "e:F",
        "envs.1.id": "pkg.mod:Env",
        "opcd.retention_envs.0.id": "g:H",
    }
    chat = config({"backend": "chat", "options": {"class": "a:B"}})
    assert code_references(chat) == {"model.options.class": "a:B", **rest}
    with trusting_code():  # a config may name an interpreter only with the user's consent
        vllm = config({"backend": "vllm", "options": {"python": "/x/bin/python"}})
    assert code_references(vllm) == {"model.options.python": "/x/bin/python", **rest}
