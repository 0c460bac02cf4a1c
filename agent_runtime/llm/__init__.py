"""Policy backends behind one batched protocol (`base`), built from a `ModelConfig` by `build.make_backend`;
`options` (each backend's typed options), `modes` (choice or free text), the backends themselves
(`transformers_backend`, `scripted`, `vllm_backend` and `vllm_process`, `chat_backend`)."""

from agent_runtime.llm.base import BackendError, Chat, Completion, Message, PolicyBackend, SamplingParams
from agent_runtime.llm.build import (
    BACKENDS,
    LOCAL_WEIGHTS,
    backend_needs,
    check_capabilities,
    make_backend,
    making_room,
    training_device,
)

__all__ = [
    "BACKENDS",
    "LOCAL_WEIGHTS",
    "BackendError",
    "Chat",
    "Completion",
    "Message",
    "PolicyBackend",
    "SamplingParams",
    "backend_needs",
    "check_capabilities",
    "make_backend",
    "making_room",
    "training_device",
]
