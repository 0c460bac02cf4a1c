"""`model.options`, typed per backend: what each backend accepts, checked when a config is read (`ModelConfig`) and
given to the backend's builder (`agent_runtime.llm.BUILDERS`).

An option left out (None) takes the backend's own default, written once in the backend's constructor; these models
say only what may be given and what is valid.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from distill.config_base import StrictConfig


class TransformersOptions(StrictConfig):
    """The transformers backend (`TransformersBackend`)."""

    prefix_cache: bool | None = Field(None, description="keep each slot's KV cache across turns (default on)")
    min_shared_prefix: int | None = Field(
        None, ge=1, description="a prefix the rows of a call share runs once when at least this long"
    )
    prefix_cache_tokens: int | None = Field(
        None, ge=0, description="tokens the slot caches keep (0: nothing across calls)"
    )


class ScriptedOptions(StrictConfig):
    """The scripted backend (`ScriptedBackend`: tests and demos)."""

    mode: Literal["random-admissible", "fixed", "sequence"] | None = None
    fixed_answer: str | None = None
    replies: list[str] | None = Field(None, description="mode sequence: the replies, in order")
    seed: int | None = Field(None, description="default: the run's seed")
    context_window: int | None = Field(None, gt=0)
    lesson_reply: str | None = Field(None, description="its reply as a lesson extractor")
    follow_lessons: bool | None = Field(None, description="act as the lessons in the prompt say")


class ChatOptions(StrictConfig):
    """The chat backend (`ChatBackend`: any LangChain chat model)."""

    class_: str | None = Field(None, alias="class", description="package.module:ClassName of the chat model")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="the chat model's own arguments")
    tokenizer: str | None = Field(None, description="a tokenizer to count tokens with (alias, id or path)")
    max_concurrency: int | None = Field(None, gt=0)
    lora_api: str | None = Field(None, description="where to load adapters at run time (default: kwargs.base_url)")
    model_field: str | None = Field(None, description="the kwarg naming the served model (default: model)")


class VLLMOptions(BaseModel):
    """The vllm backend (`VLLMBackend`, or `VLLMProcessBackend` with `python`); keys not named here go to `vllm.LLM`
    as engine arguments."""

    model_config = {"extra": "allow"}
    python: str | None = Field(None, description="the interpreter of vLLM's own environment (the engine runs there)")
    max_lora_rank: int | None = Field(None, ge=1)
    max_loras: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    choice_trie_above: int | None = Field(None, ge=1, description="larger action sets are decoded, not scored")


BACKEND_OPTIONS: dict[str, type[BaseModel]] = {
    "transformers": TransformersOptions,
    "scripted": ScriptedOptions,
    "chat": ChatOptions,
    "vllm": VLLMOptions,
}


def given(options: BaseModel) -> dict[str, Any]:
    """The options that were given (None: the backend's default), as keyword arguments."""
    return options.model_dump(exclude_none=True)


def backend_options(backend: str, options: dict[str, Any]) -> BaseModel:
    """`options` validated by `backend`'s option model; a ValueError names the key and what the backend accepts."""
    kind = BACKEND_OPTIONS[backend]
    try:
        return kind.model_validate(options)
    except ValidationError as exc:
        accepted = ", ".join(sorted((f.alias or name) for name, f in kind.model_fields.items()))
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc'])}: "
            + ("unknown option" if e["type"] == "extra_forbidden" else e["msg"])
            for e in exc.errors()
        )
        extra = " (and vLLM's engine arguments)" if backend == "vllm" else ""
        raise ValueError(f"the {backend} backend: {problems}; accepted: {accepted}{extra}") from None
