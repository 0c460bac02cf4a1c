"""What a config may make a model backend do: start no interpreter it names, hand vLLM no
engine argument that names code or a file, and send no API key from this machine's environment to a host it
names, unless the user says so (`--trust-code`, `AGENT_RUNTIME_VLLM_PYTHON`, `--trust-endpoint` or
`AGENT_RUNTIME_TRUSTED_ENDPOINTS`); a resumed run takes no engine argument from its stored config; a chat server
that fails is a clean error, the run kept."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from agent_runtime.cli import main
from agent_runtime.config import ConfigError, ModelConfig, config_from_dict, load_config, resume_differences
from agent_runtime.llm import make_backend
from agent_runtime.llm.base import BackendError, SamplingParams
from agent_runtime.llm.chat_backend import ChatBackend
from agent_runtime.llm.options import ENGINE_ARGUMENTS, TRUSTED_ENDPOINTS_ENV, VLLM_PYTHON_ENV, backend_options
from agent_runtime.run.loop import AgentLoop
from environments.registry import TRUST_ENV, trusting_code
from memory import ExperienceStore

ENV_KEY = "sk-from-the-users-environment"


@pytest.fixture(autouse=True)
def untrusted(monkeypatch):
    """No opt-in of any kind from the environment, and none left behind."""
    monkeypatch.setenv(TRUST_ENV, "0")
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    monkeypatch.delenv(TRUSTED_ENDPOINTS_ENV, raising=False)


@dataclass
class Program:
    path: Path
    marker: Path


@pytest.fixture
def interpreter(tmp_path) -> Program:
    """A program posing as vLLM's interpreter: it writes the first request it is sent (the engine's start, with
    its arguments) to `interpreter.marker`, then exits."""
    marker = tmp_path / "interpreter-ran"
    program = tmp_path / "script.sh"
    program.write_text(f"#!/bin/sh\nhead -n 1 > {marker}\n")
    program.chmod(0o755)
    return Program(program, marker)


def vllm_config(tmp_path: Path, **options) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return {
        "name": "t",
        "model": {"name": str(model), "backend": "vllm", "options": options},
        "envs": [{"id": "environments.testing:GuessEnv", "max_steps": 3}],
        "runtime": {"episodes": 1},
        "memory": {"embedder": "hash"},
    }


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def start_request(interpreter: Program) -> dict:
    return json.loads(interpreter.marker.read_text())


# 1. model.options.python --------------------------------------------------------------------------------------
COMMANDS = {
    "run": ["run"],
    "run --dry-run": ["run", "--dry-run"],
    "eval": ["eval"],
    "distill": ["distill"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_interpreter_a_config_names_is_not_started(tmp_path, interpreter, command, capsys):
    data = vllm_config(tmp_path, python=str(interpreter.path))
    with ExperienceStore.open(tmp_path / "w") as store:  # distill builds the backend for a run that exists
        store.create_run("t", {"name": "t"})
    path = write_yaml(tmp_path / "t.yaml", data)
    assert main([*COMMANDS[command], str(path), "--workdir", str(tmp_path / "w")]) == 2
    assert not interpreter.marker.exists(), "the config's program ran"
    err = capsys.readouterr().err
    assert "model.options: the vllm backend: python: " in err and str(interpreter.path) in err
    assert "--trust-code" in err and f"{VLLM_PYTHON_ENV}={interpreter.path}" in err


def test_the_users_own_vllm_interpreter_and_trust_code_start_it(tmp_path, interpreter, monkeypatch, capsys):
    """The interpreter named in AGENT_RUNTIME_VLLM_PYTHON is the user's own choice; --trust-code allows any."""
    path = write_yaml(tmp_path / "t.yaml", vllm_config(tmp_path, python=str(interpreter.path)))
    assert main(["run", str(path), "--workdir", str(tmp_path / "w"), "--trust-code", "--no-progress"]) == 2
    assert start_request(interpreter)["op"] == "start", "--trust-code started it"
    assert "the vLLM process exited" in capsys.readouterr().err, "a clean error: the program is no vLLM"
    interpreter.marker.unlink()
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(interpreter.path))
    assert main(["run", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"]) == 2
    assert start_request(interpreter)["op"] == "start", "the interpreter the user named started"
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(tmp_path / "another" / "python"))
    with pytest.raises(ValueError, match="python"):
        backend_options("vllm", {"python": str(interpreter.path)})


def test_a_backend_built_in_code_checks_the_interpreter_too(tmp_path, interpreter):
    """`model_copy` does not validate: the check runs again where the backend is built."""
    model = ModelConfig(name=str(tmp_path), backend="vllm").model_copy(
        update={"options": {"python": str(interpreter.path)}}
    )
    with pytest.raises(BackendError, match=r"python.*--trust-code"):
        make_backend(model)
    assert not interpreter.marker.exists()


# 2. vLLM's engine arguments -------------------------------------------------------------------------------------
REFUSED = {
    "trust_remote_code": True,
    "worker_cls": "subprocess.Popen",
    "worker_extension_cls": "os.system",
    "logits_processors": ["pty:spawn"],
    "hf_overrides": {"auto_map": {"AutoModelForCausalLM": "evil.Model"}},
    "distributed_executor_backend": "mp",
    "tokenizer": "/tmp/elsewhere",
    "download_dir": "/tmp/elsewhere",
    "kv_transfer_config": {"kv_connector_module_path": "evil.connector"},
    "reasoning_parser_plugin": "/tmp/evil.py",
    "compilation_config": {"backend": "evil.compile"},
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_engine_argument_outside_the_allow_list_is_refused_when_the_config_is_read(tmp_path, name):
    path = write_yaml(tmp_path / "t.yaml", vllm_config(tmp_path, **{name: REFUSED[name]}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert f"model.options: the vllm backend: {name}: " in message
    assert "and the engine arguments: " + ", ".join(sorted(ENGINE_ARGUMENTS)) in message
    assert "--trust-code" in message


def test_an_engine_argument_the_runtime_sets_is_refused_even_when_code_is_trusted(tmp_path):
    path = write_yaml(tmp_path / "t.yaml", vllm_config(tmp_path, dtype="float16", max_model_len=512))
    with trusting_code(), pytest.raises(ConfigError) as err:
        load_config(path)
    assert "dtype: set by the runtime, from model.dtype" in str(err.value)
    assert "max_model_len: set by the runtime, from model.context_window" in str(err.value)


@pytest.mark.parametrize(
    "name, value", [("kv_cache_dtype", "os:system"), ("quantization", "../x"), ("max_num_seqs", {"a": 1})]
)
def test_an_allowed_engine_argument_takes_plain_values_only(tmp_path, name, value):
    with pytest.raises(ConfigError, match=rf"model.options: the vllm backend: {name}: "):
        load_config(write_yaml(tmp_path / "t.yaml", vllm_config(tmp_path, **{name: value})))


def test_allowed_engine_arguments_reach_the_engine(tmp_path, interpreter, monkeypatch):
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(interpreter.path))
    options = {"python": str(interpreter.path), "max_num_seqs": 8, "enforce_eager": True, "kv_cache_dtype": "fp8"}
    config = load_config(write_yaml(tmp_path / "t.yaml", vllm_config(tmp_path, **options)))
    with pytest.raises(BackendError, match="the vLLM process exited"):
        make_backend(config.model)
    kwargs = start_request(interpreter)["kwargs"]
    assert (kwargs["max_num_seqs"], kwargs["enforce_eager"], kwargs["kv_cache_dtype"]) == (8, True, "fp8")


def test_trust_code_lets_any_engine_argument_through_end_to_end(tmp_path, interpreter, monkeypatch, capsys):
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(interpreter.path))
    data = vllm_config(tmp_path, python=str(interpreter.path), worker_cls="my_workers.Worker", hf_overrides={"a": 1})
    path = write_yaml(tmp_path / "t.yaml", data)
    assert main(["run", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"]) == 2
    assert not interpreter.marker.exists() and "worker_cls" in capsys.readouterr().err
    assert main(["run", str(path), "--workdir", str(tmp_path / "w2"), "--no-progress", "--trust-code"]) == 2
    kwargs = start_request(interpreter)["kwargs"]
    assert kwargs["worker_cls"] == "my_workers.Worker" and kwargs["hf_overrides"] == {"a": 1}


STORED = {
    "model.options.worker_cls": {"worker_cls": "subprocess.Popen"},
    "model.options.kv_transfer_config.kv_connector_module_path": {
        "kv_transfer_config": {"kv_connector": "X", "kv_connector_module_path": "evil.connector"}
    },
    "model.options.reasoning_parser_plugin": {"reasoning_parser_plugin": "/tmp/evil.py"},
    "model.options.hf_overrides.auto_map.AutoModel": {"hf_overrides": {"auto_map": {"AutoModel": "evil.M"}}},
    "model.options.max_num_seqs": {"max_num_seqs": 1024},  # an allowed one too: any difference
    "model.options.log_file": {"log_file": "/tmp/elsewhere.log"},
}


@pytest.mark.parametrize("field", sorted(STORED))
def test_resume_refuses_any_difference_in_engine_arguments(tmp_path, field):
    with trusting_code():  # even for a user who trusts code: the stored config is data
        stored = config_from_dict(vllm_config(tmp_path, **STORED[field]))
        given = config_from_dict(vllm_config(tmp_path))
        with pytest.raises(ConfigError, match=rf"differ in fields that decide what runs(.|\n)*  {field}: stored "):
            resume_differences(stored, given, "the stored config of run 1")
        with pytest.raises(ConfigError, match=rf"  {field}: stored None, given "):
            resume_differences(given, stored, "the stored config of run 1")


def test_an_imported_run_cannot_inject_engine_arguments_into_a_resume(tmp_path):
    with trusting_code(), ExperienceStore.open(tmp_path) as store:  # an export made by someone who trusted it
        store.create_run("t", config_from_dict(vllm_config(tmp_path, worker_cls="x.W")).model_dump(mode="json"))
    with pytest.raises(ConfigError, match="worker_cls"):
        AgentLoop(config_from_dict(vllm_config(tmp_path)), tmp_path, resume=True, progress=False)
    with trusting_code(), pytest.raises(ConfigError, match="model.options.worker_cls: stored 'x.W', given None"):
        AgentLoop(config_from_dict(vllm_config(tmp_path)), tmp_path, resume=True, progress=False)


def test_the_backends_own_vllm_sizes_may_differ_on_resume(tmp_path):
    stored = config_from_dict(vllm_config(tmp_path, max_lora_rank=16, max_loras=2, choice_trie_above=64))
    given = config_from_dict(vllm_config(tmp_path, max_lora_rank=16))
    lines = resume_differences(stored, given, "the stored config")
    assert lines == [
        "  model.options.choice_trie_above: stored 64, given None (the stored value is kept)",
        "  model.options.max_loras: stored 2, given None (the stored value is kept)",
    ]


# 3. a chat model's endpoint and the user's API key ---------------------------------------------------------------
COMPLETION = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "\\boxed{1}"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


class Listener:
    """An HTTP server on a free loopback port that records every request (path, headers) and answers an OpenAI
    chat completion, or `status` with an error body."""

    def __init__(self, status: int = 200):
        self.requests: list[dict] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                listener.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": self.rfile.read(length)}
                )
                ok = status == 200
                data = json.dumps(COMPLETION if ok else {"error": {"message": "the server broke"}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def authorizations(self) -> list[str | None]:
        return [{k.lower(): v for k, v in r["headers"].items()}.get("authorization") for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def failing_server():
    server = Listener(status=500)
    yield server
    server.close()


def chat_options(url: str, **kwargs) -> dict:
    return {
        "class": "langchain_openai:ChatOpenAI",
        "kwargs": {"base_url": url, "model": "m", "max_retries": 0, "timeout": 10, **kwargs},
    }


def chat_run(tmp_path: Path, options: dict, episodes: int = 1) -> Path:
    data = {
        "name": "t",
        "model": {"name": "remote", "backend": "chat", "options": options},
        "envs": [{"id": "math/gsm_symbolic"}],
        "runtime": {"episodes": episodes, "slots": 1},
        "memory": {"embedder": "hash"},
    }
    return write_yaml(tmp_path / "t.yaml", data)


def ask(backend: ChatBackend) -> str:
    return backend.generate([[{"role": "user", "content": "1 + 0?"}]], SamplingParams(max_new_tokens=4))[0].text


def test_a_configs_endpoint_gets_no_key_from_the_users_environment(tmp_path, listener, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    path = chat_run(tmp_path, chat_options(listener.url))
    assert main(["run", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"]) == 2
    assert listener.requests == [], "nothing reached the config's host"
    err = capsys.readouterr().err
    assert "kwargs.base_url" in err and listener.url in err
    assert f"--trust-endpoint {listener.url}" in err and TRUSTED_ENDPOINTS_ENV in err
    for endpoint in ("openai_api_base", "openai_proxy"):
        with pytest.raises(BackendError, match=rf"kwargs.{endpoint}"):
            ChatBackend.from_options({"class": "langchain_openai:ChatOpenAI", "kwargs": {endpoint: listener.url}})
    assert listener.requests == []


def test_a_confirmed_endpoint_gets_the_key(tmp_path, listener, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    path = chat_run(tmp_path, chat_options(listener.url))
    argv = ["run", str(path), "--workdir", str(tmp_path / "w"), "--no-progress", "--trust-endpoint", listener.url]
    assert main(argv) == 0
    assert listener.authorizations() == [f"Bearer {ENV_KEY}"], "the user confirmed this host"
    origin = listener.url.removesuffix("/v1")
    monkeypatch.setenv(TRUSTED_ENDPOINTS_ENV, f"http://elsewhere:1/v1, {origin}/")  # the host decides, not the path
    assert ask(ChatBackend.from_options(chat_options(listener.url))) == "\\boxed{1}"
    assert listener.authorizations() == [f"Bearer {ENV_KEY}"] * 2
    monkeypatch.setenv(TRUSTED_ENDPOINTS_ENV, "http://127.0.0.1:1/v1")
    with pytest.raises(BackendError, match="kwargs.base_url"):
        ChatBackend.from_options(chat_options(listener.url))


def test_a_config_that_gives_its_own_key_needs_no_confirmation(listener, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    assert ask(ChatBackend.from_options(chat_options(listener.url, api_key="the-servers-own"))) == "\\boxed{1}"
    assert listener.authorizations() == ["Bearer the-servers-own"]


def test_a_chat_server_error_is_a_clean_error_and_the_run_is_kept(tmp_path, failing_server, capsys):
    path = chat_run(tmp_path, chat_options(failing_server.url, api_key="none"))
    assert main(["run", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert failing_server.requests, "the server was asked"
    assert "Traceback" not in err and "500" in err and failing_server.url in err and "--resume" in err
    with ExperienceStore.open(tmp_path / "w") as store:
        [run] = store.runs()
        assert run.status == "stopped", "the run is kept, to be resumed"
