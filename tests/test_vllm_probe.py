"""Which adapter acted, on vLLM for real: the fingerprint vLLM's engine (in its own environment's child process)
and a `vllm serve` server (through the chat backend) report, and the post-promotion probe against them, on
SmolLM2-135M-Instruct with an adapter our OPCD trainer wrote.

Like tests/test_vllm.py: skipped, saying how to build it, without vLLM's CPU environment (`bash .ci/vllm-env.sh`);
failed when AGENT_RUNTIME_VLLM_PYTHON names a missing interpreter. The stale backends are the real ones behind a
wrapper whose adapter switches never reach the engine (it keeps acting with the base model).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agent_runtime.adapter_probe import (
    FLOAT32_TOLERANCE,
    LOW_PRECISION_TOLERANCE,
    StaleAdapterError,
    build_reference,
    judge,
    measure,
)
from agent_runtime.config import ModelConfig
from agent_runtime.llm import make_backend
from distill.fingerprint import fingerprint_files

ROOT = Path(__file__).resolve().parents[1]
PYTHON_ENV = "AGENT_RUNTIME_VLLM_PYTHON"
ALIAS = "smollm2-135m-instruct"
GAME = "You play a text adventure game. Reply with exactly one of the admissible actions."
ACTIONS = ["go north", "take coin", "look", "inventory"]
LESSON = "Lessons from your past experience:\n- EXPERIENCE ITEM: When you see a coin, take coin at once."
ROOMS = ["Kitchen", "Hall", "Cellar", "Garden"]
DECISIONS = [([{"role": "system", "content": GAME},
               {"role": "user", "content": f"-= {room} =-\nYou are in a {room.lower()}. There is a coin on the floor. "
                                           f"An exit leads north.\nAdmissible actions: {', '.join(ACTIONS)}"}], ACTIONS)
             for room in ROOMS]


def _vllm_python() -> str:
    path = os.environ.get(PYTHON_ENV)
    if path:
        if not Path(path).is_file():
            pytest.fail(f"{PYTHON_ENV}={path} does not exist; build it with `bash .ci/vllm-env.sh`")
        return path
    found = subprocess.run(["bash", str(ROOT / ".ci" / "vllm-env.sh"), "--find"], capture_output=True, text=True,
                           check=False).stdout.strip()
    if not found:
        pytest.skip("vLLM's CPU environment is not built: `bash .ci/vllm-env.sh` builds it (a few minutes, once), "
                    f"or set {PYTHON_ENV} to a Python with vLLM")
    return found


@pytest.fixture(scope="module")
def vllm_python() -> str:
    return _vllm_python()


@pytest.fixture(scope="module")
def smollm2(vllm_python) -> str:
    from agent_runtime.checkpoints import resolve_model

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENT_RUNTIME_CACHE", str(Path.home() / ".cache" / "agent-runtime"))
        return resolve_model(ALIAS)


@pytest.fixture(scope="module")
def adapter(smollm2, tmp_path_factory) -> Path:
    """Two choice-policy OPCD steps at a large learning rate: an adapter that moves the game's choice far."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from distill.opcd import OPCDConfig, OPCDTrainer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    trainer = OPCDTrainer(model, tokenizer, OPCDConfig(lr=1e-3, steps=2, batch_size=2, lora_r=8, lora_alpha=16,
                                                       sampler="live", gradient_checkpointing=False))
    for _ in range(2):
        trainer.step([d[0] for d in DECISIONS[:2]], [LESSON] * 2, [ACTIONS] * 2)
    return trainer.save_adapter(tmp_path_factory.mktemp("adapters") / "cycle-1")


@pytest.fixture(scope="module")
def reference(smollm2, adapter):
    info = SimpleNamespace(id=1, name="cycle-1", path=str(adapter), fingerprint=fingerprint_files(adapter))
    return build_reference(smollm2, info, None, DECISIONS)


class NoSwitch:
    """A real backend whose adapter loads and switches never reach its engine."""

    def __init__(self, inner):
        self._inner = inner
        self.adapters: dict[str, str] = {}
        self.active_adapter = None

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def load_adapter(self, name, path):
        self.adapters[name], self.active_adapter = str(path), name

    def use_adapter(self, name):
        self.active_adapter = name

    def adapter_fingerprint(self):
        return self._inner.adapter_fingerprint()

    def choose(self, prompts, choices, params):
        return self._inner.choose(prompts, choices, params)

    def generate(self, prompts, params):
        return self._inner.generate(prompts, params)


@pytest.mark.slow
def test_the_vllm_engine_reports_the_fingerprint_and_passes_the_probe(vllm_python, smollm2, adapter, reference,
                                                                        tmp_path):
    engine = make_backend(ModelConfig(name=smollm2, backend="vllm", dtype="float32", context_window=2048, options={
        "python": vllm_python, "max_lora_rank": 16, "log_file": str(tmp_path / "vllm.log")}))
    try:
        assert engine.adapter_fingerprint() is None
        engine.load_adapter("cycle-1", adapter)
        assert engine.adapter_fingerprint() == fingerprint_files(adapter) == reference.fingerprint
        result = judge(reference, measure(engine, reference), where="the vllm engine", tolerance=FLOAT32_TOLERANCE)
        print(f"\n[vllm probe] {result.line()}")
        assert result.verdict == "adapter" and result.to_adapter < 1e-3 and result.shift > 0.5, result
        engine.use_adapter(None)
        assert engine.adapter_fingerprint() is None
        with pytest.raises(StaleAdapterError, match="the vllm engine does not act with adapter cycle-1 after its "
                                                    "promotion: it acts as the parent"):
            judge(reference, measure(NoSwitch(engine), reference), where="the vllm engine",
                  tolerance=FLOAT32_TOLERANCE)
    finally:
        engine.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def server(vllm_python, smollm2, tmp_path):
    """vLLM's OpenAI-compatible server on loopback with runtime LoRA loading (as in tests/test_vllm.py)."""
    port = _free_port()
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "TORCHDYNAMO_DISABLE": "1",
           "VLLM_LOGGING_LEVEL": "WARNING"}
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", smollm2, "--host", "127.0.0.1",
             "--port", str(port), "--served-model-name", ALIAS, "--dtype", "float32", "--max-model-len", "2048",
             "--seed", "0", "--enable-lora", "--max-lora-rank", "16", "--gpu-memory-utilization", "0.15"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, f"vllm serve exited: {log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=10) as response:
                    json.loads(response.read())
                break
            except OSError:
                assert time.monotonic() < deadline, f"vllm serve not up in 600 s: {log.read_text()[-3000:]}"
                time.sleep(2)
        yield url
    finally:
        for sig, wait in ((15, 60), (9, None)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


@pytest.mark.slow
def test_a_served_adapter_is_fingerprinted_and_probed_through_the_chat_backend(server, adapter, reference):
    from agent_runtime.llm.chat_backend import ChatBackend

    options = {"class": "langchain_openai:ChatOpenAI", "max_concurrency": 4,
               "kwargs": {"base_url": server, "model": ALIAS, "api_key": "none", "temperature": 0.7, "max_tokens": 24}}
    backend = ChatBackend.from_options(options)
    backend.load_adapter("cycle-1", str(adapter))
    assert backend.adapter_fingerprint() == reference.fingerprint, "the files the server was given"
    measured = measure(backend, reference)
    assert measured.mode == "greedy", "a chat API reports no choice distribution: the greedy replies are probed"
    # a run does not know a server's precision and probes it at the low-precision tolerance; greedy free text is
    # a weak probe (SmolLM2's replies part from the parent's at near-ties), too weak at that tolerance here
    loose = judge(reference, measured, where="the vllm server", tolerance=LOW_PRECISION_TOLERANCE)
    assert loose.verdict == "inconclusive" or loose.verdict == "adapter", loose
    # this server runs in float32, as the engine above: at its own tolerance the probe tells the two apart
    result = judge(reference, measured, where="the vllm server", tolerance=FLOAT32_TOLERANCE)
    print(f"\n[vllm probe] {result.line()}")
    assert result.verdict == "adapter" and result.to_adapter < 1e-3, result
    stale = NoSwitch(ChatBackend.from_options(options))
    stale.load_adapter("cycle-1", str(adapter))  # the server is never asked for it: the base model answers
    with pytest.raises(StaleAdapterError, match="the vllm server does not act with adapter cycle-1") as caught:
        judge(reference, measure(stale, reference), where="the vllm server", tolerance=FLOAT32_TOLERANCE)
    print(f"[vllm probe] stale: {caught.value.result.line()}")
