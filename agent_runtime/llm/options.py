"""`model.options`, typed per backend: what each backend accepts, checked when a config is read (`ModelConfig`) and
given to the backend's builder (`agent_runtime.llm.BUILDERS`).

An option left out (None) takes the backend's own default, written once in the backend's constructor; these models
say only what may be given and what is valid.

And what a config alone may not give, because a config is data (it may come from someone else, or from an imported
run's store) and these options would make it code: the interpreter vLLM's engine runs under (`python`: a program this
machine would start), and vLLM engine arguments beyond `VLLMEngineArguments` (vLLM imports several by dotted name,
`worker_cls`, `worker_extension_cls`, `logits_processors`, a KV connector's module, `hf_overrides`' auto-map, and
others name files to read or write). Both are refused unless the user allows them: `--trust-code` for the command
(`environments.registry.code_trusted`), or, for the interpreter, naming the same one in `AGENT_RUNTIME_VLLM_PYTHON`
(the variable where the project already has the user put vLLM's environment). A chat model's endpoint is checked
where the model class is known (`agent_runtime.llm.chat_backend.load_chat_model`): a config that sends requests to a
host of its choosing, with the API key the client takes from this machine's environment, needs the user's
confirmation of that host (`--trust-endpoint URL`, or `AGENT_RUNTIME_TRUSTED_ENDPOINTS`); the helpers for it are here.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from modelkit.config_base import StrictConfig

# `environments` and `memory` are imported where they are used, not here: the vLLM child process imports this
# module (through agent_runtime.llm) with only agent_runtime and modelkit on its path (vllm_process.PACKAGES), and
# its environment has neither their packages nor sqlalchemy.

# the interpreter of vLLM's own environment, as the user names it (`.ci/run` exports it; docs/scaling.md)
VLLM_PYTHON_ENV = "AGENT_RUNTIME_VLLM_PYTHON"
# the base URLs the user confirms a config may send their API key to, comma separated (`--trust-endpoint` adds one
# for a command; an environment variable, so that processes the run starts, such as Ray workers, inherit it)
TRUSTED_ENDPOINTS_ENV = "AGENT_RUNTIME_TRUSTED_ENDPOINTS"


class TransformersOptions(StrictConfig):
    """The transformers backend (`TransformersBackend`)."""

    prefix_cache: bool | None = Field(None, description="keep each slot's KV cache across turns (default on)")
    min_shared_prefix: int | None = Field(
        None, ge=1, description="a prefix the rows of a call share runs once when at least this long"
    )
    prefix_cache_mb: float | None = Field(
        None, ge=0, description="memory the stored KV may take, in MB (default 512; 0: nothing across calls)"
    )
    prefix_cache_tokens: int | None = Field(
        None, ge=0, description="an additional bound in tokens (default none; 0: nothing across calls)"
    )
    choice_batch_mb: float | None = Field(
        None, gt=0, description="KV memory of one packed choice forward, in MB; a call's rows go in groups (default 64)"
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


_WORD = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _a_word(value: str) -> str:
    if not _WORD.fullmatch(value):
        raise ValueError(
            f"{value!r} is not one of vLLM's names for it: a word of letters, digits, _ and - (e.g. auto, fp8), "
            "never a dotted path or a file"
        )
    return value


# one of vLLM's own named choices (a quantization method, a KV-cache dtype): a word, never a dotted path or a file
VLLMName = Annotated[str, AfterValidator(_a_word)]


class VLLMEngineArguments(BaseModel):
    """The vLLM engine arguments a config may give without `--trust-code`: sizes, switches and names of vLLM's own
    choices, none of which names code or a file. vLLM checks their values itself when the engine starts."""

    tensor_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int | None = Field(None, ge=1)
    data_parallel_size: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_logprobs: int | None = Field(None, ge=0)
    max_cpu_loras: int | None = Field(None, ge=1)
    block_size: int | None = Field(None, ge=1)
    num_gpu_blocks_override: int | None = Field(None, ge=1)
    kv_cache_memory_bytes: int | None = Field(None, ge=0)
    swap_space: float | None = Field(None, ge=0, description="GiB of CPU memory per GPU for swapped-out requests")
    cpu_offload_gb: float | None = Field(None, ge=0)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    enforce_eager: bool | None = None
    enable_sleep_mode: bool | None = None
    disable_log_stats: bool | None = None
    disable_custom_all_reduce: bool | None = None
    disable_sliding_window: bool | None = None
    fully_sharded_loras: bool | None = None
    kv_cache_dtype: VLLMName | None = None
    quantization: VLLMName | None = None
    lora_dtype: VLLMName | None = None
    scheduling_policy: Literal["fcfs", "priority"] | None = None


ENGINE_ARGUMENTS = tuple(VLLMEngineArguments.model_fields)
# the vllm backend's own sizes, which decide neither what runs nor what is read or written: a resumed run may keep its
# stored ones (every other key of a vllm config's options, an engine argument, must not differ; `resume_differences`)
VLLM_SIZES = ("choice_trie_above", "gpu_memory_utilization", "max_lora_rank", "max_loras")
# engine arguments the runtime sets itself, and from where; given in model.options they would clash with its own
RUNTIME_SET = {
    "model": "model.name",
    "dtype": "model.dtype",
    "max_model_len": "model.context_window",
    "seed": "the run's seed",
    "enable_lora": "always on (adapters are hot-swapped)",
    "logprobs_mode": "always processed_logprobs (as the transformers backend records them)",
}


def interpreter_path(python: str) -> str:
    """The program `python` names, as the vllm backend starts it (a bare name is looked up on PATH)."""
    expanded = os.path.expanduser(python)
    return os.path.abspath(shutil.which(expanded) or expanded)


class VLLMOptions(VLLMEngineArguments):
    """The vllm backend (`VLLMBackend`, or `VLLMProcessBackend` with `python`): its own options and the engine
    arguments of `VLLMEngineArguments`; any other key is an engine argument only under `--trust-code`."""

    model_config = ConfigDict(extra="allow")
    python: str | None = Field(None, description="the interpreter of vLLM's own environment (the engine runs there)")
    log_file: str | None = Field(
        None, description="with python: where the engine's process logs (default: a temp file)"
    )
    max_lora_rank: int | None = Field(None, ge=1)
    max_loras: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    choice_trie_above: int | None = Field(None, ge=1, description="larger action sets are decoded, not scored")

    @field_validator("python")
    @classmethod
    def _the_users_own_interpreter(cls, python: str | None) -> str | None:
        from environments.registry import code_trusted

        chosen = os.environ.get(VLLM_PYTHON_ENV)
        if python and not code_trusted() and not (chosen and interpreter_path(chosen) == interpreter_path(python)):
            raise ValueError(
                f"{python!r} is a program the runtime would start (vLLM's interpreter), and a config alone may not "
                f"choose one; to allow it, name it as your vLLM environment's interpreter, {VLLM_PYTHON_ENV}="
                f"{python} (`bash .ci/vllm-env.sh` prints the one it builds), or run the command with --trust-code"
            )
        return python

    @model_validator(mode="after")
    def _engine_arguments_name_no_code(self) -> VLLMOptions:
        from environments.registry import TRUST_HINT, code_trusted

        extra = sorted(self.model_extra or {})
        clashes = [name for name in extra if name in RUNTIME_SET]
        if clashes:
            raise ValueError(
                "; ".join(f"{name}: set by the runtime, from {RUNTIME_SET[name]}" for name in clashes)
                + "; leave it out of model.options"
            )
        if extra and not code_trusted():
            raise ValueError(
                f"{', '.join(extra)}: not among the engine arguments a config may give (vLLM imports some by name, "
                f"worker_cls, logits_processors, ..., and others name files it reads or writes); {TRUST_HINT}"
            )
        return self


# a chat model's argument that says where its requests go: base_url, openai_api_base, azure_endpoint, openai_proxy, ...
_ENDPOINT_KWARG = re.compile(r"(url|uri|base|endpoint|host|proxy|address)$", re.IGNORECASE)


def endpoint_origin(url: str) -> str | None:
    """Where requests to `url` go, as scheme://host:port (a path or a user name does not change the host that gets
    them); None when `url` names no host."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname:
        return None
    scheme = parts.scheme.lower()
    return f"{scheme}://{parts.hostname.lower()}:{port or {'http': 80, 'https': 443}.get(scheme)}"


def endpoint_url(text: str) -> str:
    """`text` if it is a URL with a host (what `--trust-endpoint` takes), else a ValueError."""
    if endpoint_origin(text) is None:
        raise ValueError(f"{text!r} is not a URL with a host, e.g. http://127.0.0.1:8000/v1")
    return text


def trusted_origins() -> set[str]:
    """The hosts the user confirmed (`AGENT_RUNTIME_TRUSTED_ENDPOINTS`, base URLs, comma separated)."""
    urls = os.environ.get(TRUSTED_ENDPOINTS_ENV, "").split(",")
    return {found for found in map(endpoint_origin, urls) if found is not None}


@contextmanager
def trusting_endpoints(urls: Iterable[str]) -> Iterator[None]:
    """Confirm the hosts of `urls` while the block runs (added to `AGENT_RUNTIME_TRUSTED_ENDPOINTS`, which processes
    the block starts inherit); the previous setting after it."""
    previous, urls = os.environ.get(TRUSTED_ENDPOINTS_ENV), list(urls)
    if urls:
        os.environ[TRUSTED_ENDPOINTS_ENV] = ",".join([previous, *urls] if previous else urls)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(TRUSTED_ENDPOINTS_ENV, None)
        else:
            os.environ[TRUSTED_ENDPOINTS_ENV] = previous


def unconfirmed_endpoints(kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    """The arguments among a chat model's `kwargs` that send its requests to a host the user has not confirmed
    (name, value), when the kwargs carry no credential of their own: the client would then send the one it takes
    from this machine's environment. None when they carry one (that one goes where the config says)."""
    from memory.redaction import is_secret_key

    if any(is_secret_key(key) and value not in (None, "") for key, value in kwargs.items()):
        return []
    trusted = trusted_origins()
    return [
        (key, str(value))
        for key, value in kwargs.items()
        if _ENDPOINT_KWARG.search(key) and value not in (None, "") and endpoint_origin(str(value)) not in trusted
    ]


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
        own = [(f.alias or name) for name, f in kind.model_fields.items() if name not in ENGINE_ARGUMENTS]
        problems = "; ".join(
            "".join(f"{x}." for x in e["loc"]).removesuffix(".")
            + (": " if e["loc"] else "")
            + ("unknown option" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, "))
            for e in exc.errors()
        )
        engine = f"; and the engine arguments: {', '.join(sorted(ENGINE_ARGUMENTS))}" if backend == "vllm" else ""
        raise ValueError(f"the {backend} backend: {problems}; accepted: {', '.join(sorted(own))}{engine}") from None
