"""The chat backend loads LoRA adapters into a vLLM server at run time and routes requests to them."""

from __future__ import annotations

import pytest

from agent_runtime.llm import SamplingParams
from agent_runtime.llm.base import BackendError
from agent_runtime.llm.chat_backend import ChatBackend
from agent_runtime.llm.fake_chat import LoraEndpoint

SPEC = "agent_runtime.llm.fake_chat:ServedModelChat"


@pytest.fixture()
def endpoint():
    server = LoraEndpoint()
    yield server
    server.close()


def saved_adapter(path):
    path.mkdir()
    (path / "adapter_config.json").write_text("{}")
    return path


def ask(backend) -> str:
    [reply] = backend.generate([[{"role": "user", "content": "2-3?"}]], SamplingParams())
    return reply.text


def test_load_and_switch_served_adapters(tmp_path, endpoint):
    backend = ChatBackend.from_options({"class": SPEC, "kwargs": {"model": "base", "base_url": endpoint.url}})
    assert ask(backend).endswith("from base")
    adapter = saved_adapter(tmp_path / "cycle-1")
    backend.load_adapter("cycle-1", adapter)
    assert endpoint.loaded == {"cycle-1": str(adapter)}
    assert backend.active_adapter == "cycle-1" and ask(backend).endswith("from cycle-1")
    backend.use_adapter(None)
    assert ask(backend).endswith("from base")

    other = ChatBackend.from_options({"class": SPEC, "kwargs": {"model": "base"}, "lora_api": endpoint.url})
    other.load_adapter("cycle-1", adapter)  # a second worker: the server already holds it, which is fine
    assert ask(other).endswith("from cycle-1")
    assert [r["path"] for r in endpoint.requests] == ["/v1/load_lora_adapter"] * 2 + ["/v1/models"]


def test_a_name_the_server_serves_from_other_files_is_refused(tmp_path, endpoint):
    """The server would go on answering with the first files while the backend reported the second's
    fingerprint: the load fails, naming both paths."""
    first = ChatBackend.from_options({"class": SPEC, "kwargs": {"model": "base", "base_url": endpoint.url}})
    first.load_adapter("cycle-1", saved_adapter(tmp_path / "run-a"))
    second = ChatBackend.from_options({"class": SPEC, "kwargs": {"model": "base", "base_url": endpoint.url}})
    with pytest.raises(BackendError, match=r"already serves LoRA adapter 'cycle-1' from .*run-a, not .*run-b"):
        second.load_adapter("cycle-1", saved_adapter(tmp_path / "run-b"))
    assert second.adapters == {} and second.active_adapter is None


def test_server_errors_are_clear(tmp_path, endpoint):
    backend = ChatBackend.from_options({"class": SPEC, "kwargs": {"model": "base", "base_url": endpoint.url}})
    with pytest.raises(BackendError, match=r"refused LoRA adapter 'x'.*HTTP 400 No adapter found.*--enable-lora"):
        backend.load_adapter("x", tmp_path / "missing")
    assert backend.active_adapter is None and backend.adapters == {}
    with pytest.raises(BackendError, match="unknown adapter 'x'; loaded: none"):
        backend.use_adapter("x")
    no_server = ChatBackend.from_options({"class": SPEC, "kwargs": {"model": "base"}})
    with pytest.raises(BackendError, match="needs the server's address: set model.options.lora_api"):
        no_server.load_adapter("x", tmp_path)
    down = ChatBackend.from_options({"class": SPEC, "kwargs": {"model": "base"}, "lora_api": "http://127.0.0.1:9/v1"})
    with pytest.raises(BackendError, match="cannot reach http://127.0.0.1:9/v1"):
        down.load_adapter("x", saved_adapter(tmp_path / "a"))
    with pytest.raises(
        BackendError,
        match="lora: unknown option; accepted: class, kwargs, lora_api, max_concurrency, model_field, tokenizer",
    ):
        ChatBackend.from_options({"class": SPEC, "lora": 1})
