"""Which adapter acted, on vLLM for real: the fingerprint vLLM's engine (in its own environment's child process)
and a `vllm serve` server (through the chat backend) report, and the post-promotion probe against them, on
SmolLM2-135M-Instruct with an adapter our OPCD trainer wrote (the engine, the server and the adapter are the
ones tests/conftest.py starts once for the vLLM test files).

Like tests/agent_runtime/llm/test_vllm.py: skipped, saying how to build it, without vLLM's CPU environment (`bash .ci/vllm-env.sh`);
failed when AGENT_RUNTIME_VLLM_PYTHON names a missing interpreter or `.ci/run` could not build it. The stale
backends are the real ones behind a wrapper whose adapter switches never reach the engine (it keeps acting with
the base model).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent_runtime.phases.probe import (
    FLOAT32_TOLERANCE,
    LOW_PRECISION_TOLERANCE,
    StaleAdapterError,
    build_reference,
    judge,
    measure,
)
from agent_runtime.testing import StaleAdapterBackend
from modelkit.fingerprint import fingerprint_files

ALIAS = "smollm2-135m-instruct"
GAME = "You play a text adventure game. Reply with exactly one of the admissible actions."
ACTIONS = ["go north", "take coin", "look", "inventory"]
ROOMS = ["Kitchen", "Hall", "Cellar", "Garden"]
DECISIONS = [
    (
        [
            {"role": "system", "content": GAME},
            {
                "role": "user",
                "content": f"-= {room} =-\nYou are in a {room.lower()}. There is a coin on the floor. "
                f"An exit leads north.\nAdmissible actions: {', '.join(ACTIONS)}",
            },
        ],
        ACTIONS,
    )
    for room in ROOMS
]


@pytest.fixture(scope="module")
def reference(smollm2, smollm2_adapter):
    """The probe's float32 transformers reference of the adapter (from tests/conftest.py) and the base model."""
    info = SimpleNamespace(
        id=1, name="cycle-1", path=str(smollm2_adapter), fingerprint=fingerprint_files(smollm2_adapter)
    )
    return build_reference(smollm2, info, None, DECISIONS)


@pytest.mark.slow
def test_the_vllm_engine_reports_the_fingerprint_and_passes_the_probe(vllm_engine, smollm2_adapter, reference):
    assert vllm_engine.adapter_fingerprint() is None
    vllm_engine.load_adapter("cycle-1", smollm2_adapter)
    assert vllm_engine.adapter_fingerprint() == fingerprint_files(smollm2_adapter) == reference.fingerprint
    result = judge(reference, measure(vllm_engine, reference), where="the vllm engine", tolerance=FLOAT32_TOLERANCE)
    print(f"\n[vllm probe] {result.line()}")
    assert result.verdict == "adapter" and result.to_adapter < 1e-3 and result.shift > 0.5, result
    vllm_engine.use_adapter(None)
    assert vllm_engine.adapter_fingerprint() is None
    with pytest.raises(
        StaleAdapterError,
        match="the vllm engine does not act with adapter cycle-1 after its promotion: it acts as the parent",
    ):
        judge(
            reference,
            measure(StaleAdapterBackend(vllm_engine), reference),
            where="the vllm engine",
            tolerance=FLOAT32_TOLERANCE,
        )


@pytest.mark.slow
def test_a_served_adapter_is_fingerprinted_and_probed_through_the_chat_backend(vllm_server, smollm2_adapter, reference):
    from agent_runtime.llm.chat_backend import ChatBackend

    options = {
        "class": "langchain_openai:ChatOpenAI",
        "max_concurrency": 4,
        "kwargs": {"base_url": vllm_server, "model": ALIAS, "api_key": "none", "temperature": 0.7, "max_tokens": 24},
    }
    backend = ChatBackend.from_options(options)
    backend.load_adapter("cycle-1", str(smollm2_adapter))
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
    stale = StaleAdapterBackend(ChatBackend.from_options(options))
    stale.load_adapter("cycle-1", str(smollm2_adapter))  # the server is never asked for it: the base model answers
    with pytest.raises(StaleAdapterError, match="the vllm server does not act with adapter cycle-1") as caught:
        judge(reference, measure(stale, reference), where="the vllm server", tolerance=FLOAT32_TOLERANCE)
    print(f"[vllm probe] stale: {caught.value.result.line()}")
