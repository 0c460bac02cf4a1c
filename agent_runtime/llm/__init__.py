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
        from agent_runtime.checkpoints import resolve_model
        from agent_runtime.llm.transformers_backend import TransformersBackend

        accepted = {"prefix_cache", "min_shared_prefix", "prefix_cache_tokens"}
        unknown = set(options) - accepted
        if unknown:
            raise BackendError(f"model.options for the transformers backend: unknown {', '.join(sorted(unknown))}; "
                               f"accepted: {', '.join(sorted(accepted))}")
        backend = TransformersBackend.from_pretrained(
            resolve_model(model_config.name),
            context_window=model_config.context_window,
            device=model_config.device,
            dtype=model_config.dtype,
            **options,
        )
        if model_config.adapter:
            backend.load_adapter("configured", model_config.adapter)
        return backend
    if kind == "chat":
        from agent_runtime.llm.chat_backend import ChatBackend

        return ChatBackend.from_options(options, context_window=model_config.context_window)
    if kind == "vllm":
        from agent_runtime.llm.vllm_backend import make_vllm_backend

        return make_vllm_backend(model_config, seed=seed)
    raise BackendError(f"unknown backend {kind!r}; accepted: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "BackendError", "Chat", "Completion", "Message", "PolicyBackend", "SamplingParams",
           "make_backend"]
