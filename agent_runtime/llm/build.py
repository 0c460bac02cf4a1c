"""Building a policy backend from a `ModelConfig` (`make_backend`), and what a run needs of one.

`transformers` is the default (CPU or GPU); `scripted` ships for tests and demos. `vllm` and `chat` are
imported lazily so their heavy or optional dependencies are needed only when a config asks for them.

What a run asks of a backend beyond the protocol (`backend_needs`: choosing among actions in choice mode,
acting with adapters when OPCD cycles run) is checked once, right after the backend is built, by
`check_capabilities`: a backend that lacks a capability stops the run before anything plays, with an error naming
the backend, the capability and the setting that needs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

from agent_runtime.llm.base import (
    AdapterBackend,
    BackendError,
    ChoiceBackend,
    LocalModelBackend,
    PolicyBackend,
    SleepingBackend,
    require,
)
from agent_runtime.llm.modes import resolve_action_mode
from agent_runtime.llm.options import given

BACKENDS = ("transformers", "scripted", "vllm", "chat")
# The backends that load `model.name`'s weights on this machine: the weights an OPCD cycle trains an adapter on.
LOCAL_WEIGHTS = ("transformers", "vllm")


def make_backend(model_config, *, seed: int = 0, run=None, families: Iterable[str] = ()) -> PolicyBackend:
    """Build the backend a `ModelConfig` names. Raises BackendError with what is accepted. With `run` (the
    run's config; `families` as for `backend_needs`) the backend is checked against what that run needs, and
    closed again if it falls short."""
    backend = _build(model_config, seed)
    if run is not None:
        try:
            check_capabilities(backend, run, families)
        except BackendError:
            backend.close()
            raise
    return backend


def _scripted(model_config, options, seed: int) -> PolicyBackend:
    from agent_runtime.llm.scripted import ScriptedBackend

    try:
        return ScriptedBackend(**{"seed": seed, **given(options)})
    except ValueError as exc:
        raise BackendError(f"model.options for the scripted backend: {exc}") from None


def _transformers(model_config, options, seed: int) -> PolicyBackend:
    from agent_runtime.checkpoints import resolve_model
    from agent_runtime.llm.transformers_backend import TransformersBackend

    backend = TransformersBackend.from_pretrained(
        resolve_model(model_config.name),
        context_window=model_config.context_window,
        device=model_config.device,
        dtype=model_config.dtype,
        **given(options),
    )
    if model_config.adapter:
        backend.load_adapter("configured", model_config.adapter)
    return backend


def _chat(model_config, options, seed: int) -> PolicyBackend:
    from agent_runtime.llm.chat_backend import ChatBackend

    return ChatBackend.from_options(options, context_window=model_config.context_window)


def _vllm(model_config, options, seed: int) -> PolicyBackend:
    """vLLM in this process, or, with `options.python`, in a child process of that interpreter (vLLM installed
    in another environment: `llm.vllm_process`). Options the backend does not name itself go to the engine."""
    from agent_runtime.checkpoints import resolve_model

    options = given(options)
    python = options.pop("python", None)
    kwargs = {"context_window": model_config.context_window, "dtype": model_config.dtype, "seed": seed, **options}
    if python:
        from agent_runtime.llm.vllm_process import VLLMProcessBackend

        backend = VLLMProcessBackend(resolve_model(model_config.name), python=python, **kwargs)
    else:
        from agent_runtime.llm.vllm_backend import VLLMBackend, import_vllm

        import_vllm()  # fail on a missing vLLM before converting or loading any weights
        backend = VLLMBackend(resolve_model(model_config.name), **kwargs)
    if model_config.adapter:
        backend.load_adapter("configured", model_config.adapter)
    return backend


# The backends by the name a config gives (`model.backend`): each built from the model's config, its options as
# the backend's own option model (`agent_runtime.llm.options`) and the run's seed.
BUILDERS = {"transformers": _transformers, "scripted": _scripted, "chat": _chat, "vllm": _vllm}


def _build(model_config, seed: int) -> PolicyBackend:
    builder = BUILDERS.get(model_config.backend)
    if builder is None:
        raise BackendError(f"unknown backend {model_config.backend!r}; accepted: {', '.join(BACKENDS)}")
    try:  # checked when the config was read; a config copied with new options (unvalidated) is checked here
        options = model_config.typed_options()
    except ValueError as exc:
        raise BackendError(f"model.options: {exc}") from None
    return builder(model_config, options, seed)


def backend_needs(config, families: Iterable[str] = ()) -> list[tuple[type, str]]:
    """The capabilities a backend acting or learning for the run `config` must have, each with what needs it.
    `families`: the environment families the backend plays (whether it acts in choice mode depends on them)."""
    mode = config.agent.action_mode
    needs: list[tuple[type, str]] = []
    if any(resolve_action_mode(mode, family) == "choice" for family in families):
        needs.append((ChoiceBackend, f"agent.action_mode {mode} (choice mode; else set agent.action_mode: free)"))
    if config.opcd.enabled:
        cycle = "an OPCD cycle evaluates its parent adapter and the new one, and the run acts with the one promoted"
        needs.append((AdapterBackend, f"opcd.enabled ({cycle})"))
    return needs


def check_capabilities(backend: PolicyBackend, config, families: Iterable[str] = ()) -> None:
    """Raise a BackendError naming `backend` and what it lacks unless it has every capability the run `config`
    needs (`backend_needs`)."""
    for capability, purpose in backend_needs(config, families):
        require(backend, capability, purpose)


def training_device(config, backend) -> str:
    """Where a cycle trains: the acting policy's own device when its weights live in this process (the
    transformers backend), else the device the config names for the model (vLLM: the same GPU, or the CPU)."""
    if isinstance(backend, LocalModelBackend):
        return "cuda" if backend.device.type == "cuda" else "cpu"
    device = config.model.device
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


@contextmanager
def making_room(backend):
    """Free the acting engine's memory while a cycle trains next to it, and bring it back after: vLLM's sleep
    mode on a GPU (weights offloaded, KV cache dropped); the transformers backend's stored prefix KV (the
    evaluation after training plays other prompts, and an adapter switch would clear it anyway), its memory handed
    back to the system at once: the store's KV is many tensors under a megabyte, which glibc keeps in its heaps
    after they are freed until it is asked to trim them."""
    prefix_kv = getattr(backend, "prefix_kv", None)
    if prefix_kv is not None:
        prefix_kv.clear()
        from modelkit.weights import release_memory

        release_memory()
    sleeper = backend if isinstance(backend, SleepingBackend) else None
    if sleeper is None or not sleeper.sleep():
        yield
        return
    try:
        yield
    finally:
        sleeper.wake_up()
