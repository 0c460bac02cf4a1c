"""Policy backends behind one batched protocol (see `base.py`), built from a `ModelConfig` by `make_backend`.

`transformers` is the default (CPU or GPU); `scripted` ships for tests and demos. `vllm` and `chat` are
imported lazily so their heavy or optional dependencies are needed only when a config asks for them.
"""

from __future__ import annotations

from agent_runtime.llm.base import BackendError, Chat, Completion, Message, PolicyBackend, SamplingParams

BACKENDS = ("transformers", "scripted", "vllm", "chat")


def make_backend(model_config, *, seed: int = 0) -> PolicyBackend:
    """Build the backend a `ModelConfig` names. Raises BackendError with what is accepted."""
    kind = model_config.backend
    options = dict(model_config.options)
    if kind == "scripted":
        from agent_runtime.llm.scripted import ScriptedBackend

        try:
            return ScriptedBackend(seed=options.pop("seed", seed), **options)
        except TypeError as exc:
            raise BackendError(f"model.options for the scripted backend: {exc}") from None
    if kind == "transformers":
        from agent_runtime.llm.transformers_backend import TransformersBackend
        from agent_runtime.models import resolve_model

        backend = TransformersBackend.from_pretrained(
            resolve_model(model_config.name),
            context_window=model_config.context_window,
            device=model_config.device,
            dtype=model_config.dtype,
        )
        if model_config.adapter:
            backend.load_adapter("configured", model_config.adapter)
        return backend
    raise BackendError(
        f"backend {kind!r} is not available yet in this version; available: transformers, scripted"
    )


__all__ = ["BACKENDS", "BackendError", "Chat", "Completion", "Message", "PolicyBackend", "SamplingParams",
           "make_backend"]
