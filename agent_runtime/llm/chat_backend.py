"""The `chat` policy backend: any langchain-core `BaseChatModel` as the acting policy or the lesson extractor.

This is how a remote model is used: an OpenAI-compatible client pointed at a vLLM server (`langchain_openai:
ChatOpenAI` with `base_url`), a hosted API, or anything else with a LangChain chat model. A batch is sent
with `BaseChatModel.batch` (concurrent requests, `max_concurrency` from the options). Remote APIs give no
logprobs and usually no token ids: token counts come from the response's usage metadata when the provider
reports it, else from `tokenizer` (a model name for the local tokenizer) when configured, else a word count.
Sampling parameters other than `stop` belong to the chat model's own constructor (providers name them
differently), so `temperature` etc. go in `options.kwargs`. The one exception is a request for log-probabilities
(`SamplingParams.logprobs`, which only the adapter probe makes): it is sent with its temperature and token budget
in OpenAI's names (`logprobs`, `temperature`, `max_tokens`), which an OpenAI-compatible server such as vLLM's
answers, and the reply's per-token log-probabilities come back in the completion. Nor can a row be seeded by
itself (`SamplingParams.seeds`): `batch` sends one set of arguments for every request, and a remote model samples as
its server does, so this is no `RowSeededBackend`: each episode played with it records `replays: false`, and a killed
and resumed run is not guaranteed to play its episodes as the run never killed would.

LoRA adapters on a vLLM server. `load_adapter(name, path)` asks the server to load a LoRA adapter at run
time (vLLM's `POST /v1/load_lora_adapter`; the server must run with `--enable-lora` and the environment
variable `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, and see `path` on its own filesystem), and
`use_adapter(name)` makes the requests name that adapter as their model (vLLM serves each loaded adapter as
a model of that name); `use_adapter(None)` goes back to the base model. The server's address is
`options.lora_api`, by default `kwargs.base_url`; the kwarg naming the served model is `options.model_field`
(default `model`). An adapter the server already holds counts as loaded, so several workers may load the
same one. The adapter's fingerprint (`modelkit.fingerprint`) is computed from the files at `path` when this
backend asks the server to load them (the runtime and the server share that filesystem, as they must for
the path to mean anything); a path this process cannot read gives no fingerprint (None), not an error.

Where requests go is the config's choice, but not where the user's API key goes: a chat model built with an
endpoint argument (`base_url`, `openai_api_base`, `azure_endpoint`, a proxy, ...) and no credential in its kwargs
would send the key its client takes from this machine's environment (OPENAI_API_KEY, ...) to that host, so
`load_chat_model` builds it only for a host the user confirmed (`--trust-endpoint URL`, or listed in
`AGENT_RUNTIME_TRUSTED_ENDPOINTS`: `agent_runtime.llm.options.unconfirmed_endpoints`). Kwargs with a key of their
own, and classes with no credential field, send none of the user's. A request the server fails (an HTTP error, a
refused connection) is a `BackendError` naming the server and what it answered: a run stops there, its finished
episodes stored, and `--resume` continues it.

Config form:

    model:
      backend: chat
      name: my-remote-policy           # a label stored with every episode
      options:
        class: langchain_openai:ChatOpenAI
        kwargs: {base_url: "http://127.0.0.1:8000/v1", model: Qwen/Qwen2.5-7B-Instruct, api_key: EMPTY}
        max_concurrency: 16
"""

from __future__ import annotations

import importlib
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from agent_runtime.llm.base import (
    BackendError,
    BackendStats,
    Chat,
    Completion,
    SamplingParams,
    apply_stop,
    closest_action,
)
from agent_runtime.llm.options import TRUSTED_ENDPOINTS_ENV, unconfirmed_endpoints
from environments.registry import UntrustedCodeError, check_code
from memory.redaction import is_secret_key, redact_text
from modelkit.chat_tokens import defuse_special_text, encode_text
from modelkit.fingerprint import fingerprint_files

# Where a chat model class may come from without --trust-code (see `load_chat_model`).
CHAT_PACKAGES = ("langchain",)
CHAT_PREFIXES = ("langchain_",)
CHAT_ENTRY_POINTS = "agent_runtime.chat_models"


def _to_langchain(chat: Chat, tokenizer=None) -> list:
    """The chat as LangChain messages; special-token text in the content is defused (the server tokenises it)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    kinds = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    try:
        return [kinds[m["role"]](content=defuse_special_text(m["content"], tokenizer)) for m in chat]
    except KeyError as exc:
        raise BackendError(f"chat backend: unknown message role {exc}; accepted: system, user, assistant") from None


def _token_logprobs(reply) -> list[float] | None:
    """The per-token log-probabilities an OpenAI-compatible reply carries (`response_metadata["logprobs"]`)."""
    content = ((reply.response_metadata or {}).get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None
    return [float(token["logprob"]) for token in content]


def load_chat_model(spec: str, kwargs: dict[str, Any]):
    """Instantiate `module:Class(**kwargs)`, checking that it is a LangChain chat model. The module is imported
    only when that runs nothing the user did not mean to load (`environments.registry.check_code`): a LangChain
    package, this project's own, one already imported, or a class an installed distribution publishes in the
    `agent_runtime.chat_models` entry-point group; any other needs the opt-in (`--trust-code`)."""
    from langchain_core.language_models import BaseChatModel

    if ":" not in spec:
        raise BackendError(f"chat backend: options.class must look like 'package.module:ClassName', got {spec!r}")
    module_name, _, attr = spec.partition(":")
    try:
        check_code(
            spec,
            what="chat backend: the chat model class",
            packages=CHAT_PACKAGES,
            prefixes=CHAT_PREFIXES,
            groups=(CHAT_ENTRY_POINTS,),
        )
    except UntrustedCodeError as exc:
        raise BackendError(str(exc)) from None
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendError(f"chat backend: cannot load {spec!r}: {exc}") from None
    # checked before anything is called: a config naming any other callable (say subprocess:Popen) runs nothing
    if not (isinstance(cls, type) and issubclass(cls, BaseChatModel)):
        raise BackendError(
            f"chat backend: {spec} is not a langchain-core BaseChatModel class; options.class "
            "must name one, e.g. langchain_openai:ChatOpenAI"
        )
    unconfirmed = unconfirmed_endpoints(kwargs) if _takes_a_key(cls) else []
    if unconfirmed:
        name, url = unconfirmed[0]
        url = redact_text(url)
        raise BackendError(
            f"chat backend: options.kwargs.{name} sends {spec}'s requests to {url}, and with no API key in the "
            "kwargs the client would send the one it takes from this machine's environment: a config alone may "
            f"not choose where your key goes. Confirm that host with --trust-endpoint {url} (run, eval, "
            f"distill) or by listing it in {TRUSTED_ENDPOINTS_ENV} (base URLs, comma separated), or give the "
            "server's own key in the kwargs (api_key)"
        )
    return cls(**kwargs)


def _takes_a_key(cls) -> bool:
    """Whether the chat model class has a credential among its fields (LangChain's clients fill it from the
    environment when the kwargs give none); a class without one has no key to send."""
    fields = getattr(cls, "model_fields", {})
    return any(is_secret_key(name) or is_secret_key(field.alias or "") for name, field in fields.items())


class ChatBackend:
    name = "chat"

    def __init__(
        self,
        chat_model,
        *,
        context_window: int = 32768,
        max_concurrency: int = 8,
        tokenizer=None,
        spec: str | None = None,
        kwargs: dict[str, Any] | None = None,
        lora_api: str | None = None,
        model_field: str = "model",
    ):
        """`spec` and `kwargs` (how `chat_model` was built) let `use_adapter` rebuild it for another served model."""
        self.chat_model = chat_model
        self._context_window = context_window
        self.max_concurrency = max_concurrency
        self.tokenizer = tokenizer
        self.stats = BackendStats()
        self._spec, self._kwargs, self._model_field = spec, dict(kwargs or {}), model_field
        self.lora_api = (lora_api or self._kwargs.get("base_url") or "").rstrip("/") or None
        self.adapters: dict[str, str] = {}
        self.fingerprints: dict[str, str | None] = {}  # by adapter name, of the files the server was given
        self.active_adapter: str | None = None

    @classmethod
    def from_options(cls, options, *, context_window: int | None = None) -> ChatBackend:
        """The backend `options` describe: a `ChatOptions`, or a dict checked against it (a BackendError names an
        unknown key and what is accepted)."""
        from agent_runtime.llm.options import ChatOptions, backend_options, given

        if not isinstance(options, ChatOptions):
            try:
                options = backend_options("chat", dict(options))
            except ValueError as exc:
                raise BackendError(f"chat backend options: {exc}") from None
        if not options.class_:
            raise BackendError("the chat backend needs model.options.class, e.g. langchain_openai:ChatOpenAI")
        model = load_chat_model(options.class_, options.kwargs)
        tokenizer = None
        if options.tokenizer:
            from transformers import AutoTokenizer

            from agent_runtime.checkpoints import resolve_model

            tokenizer = AutoTokenizer.from_pretrained(resolve_model(options.tokenizer))
        rest = {k: v for k, v in given(options).items() if k not in ("class_", "kwargs", "tokenizer")}
        if context_window:
            rest["context_window"] = context_window
        return cls(model, tokenizer=tokenizer, spec=options.class_, kwargs=options.kwargs, **rest)

    # LoRA adapters on the server ---------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> None:
        """Have the server load the LoRA adapter at `path` (its path) as model `name`, then use it."""
        if self.lora_api is None:
            raise BackendError(
                "chat backend: loading a LoRA adapter needs the server's address: set "
                "model.options.lora_api (e.g. http://vllm:8000/v1) or kwargs.base_url"
            )
        try:
            fingerprint = fingerprint_files(path)
        except OSError:  # the server's own filesystem only: nothing here to hash
            fingerprint = None
        body = json.dumps({"lora_name": name, "lora_path": str(path)}).encode()
        request = urllib.request.Request(
            f"{self.lora_api}/load_lora_adapter", data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120):
                pass
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if "already" in detail.lower():  # another worker loaded it first: fine if it is the same adapter
                self._check_served_path(name, path)
            else:
                raise BackendError(
                    f"chat backend: the server refused LoRA adapter {name!r} at {path}: HTTP {exc.code} {detail}; "
                    "a vLLM server needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and the "
                    "path must exist on the server's machine"
                ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise BackendError(
                f"chat backend: cannot reach {self.lora_api} to load LoRA adapter {name!r}: {exc}"
            ) from None
        self.adapters[name], self.fingerprints[name] = str(path), fingerprint
        self.use_adapter(name)

    def _check_served_path(self, name: str, path: str) -> None:
        """The server already serves `name`: from `path`, or a BackendError (it would go on answering with the
        other files while this backend reported the fingerprint of `path`'s). The server's `/models` lists each
        LoRA with the path it was loaded from (`root`); a server that does not say is taken at its word."""
        try:
            with urllib.request.urlopen(f"{self.lora_api}/models", timeout=30) as reply:
                served = {m.get("id"): m.get("root") for m in json.loads(reply.read()).get("data", [])}
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            return
        root = served.get(name)
        if root and os.path.normpath(str(root)) != os.path.normpath(str(path)):
            raise BackendError(
                f"chat backend: the server already serves LoRA adapter {name!r} from {root}, not "
                f"{path}; it would answer with those weights. Unload it on the server "
                "(POST /v1/unload_lora_adapter) or load these files under another name"
            )

    def adapter_fingerprint(self) -> str | None:
        """The fingerprint of the files of the served adapter requests name now (None: the base model, or
        files this process could not read)."""
        return self.fingerprints.get(self.active_adapter) if self.active_adapter else None

    def use_adapter(self, name: str | None) -> None:
        """Send requests to the served adapter `name` (loaded with `load_adapter`), or to the base model (None)."""
        if name == self.active_adapter:
            return
        if name is not None and name not in self.adapters:
            raise BackendError(f"unknown adapter {name!r}; loaded: {', '.join(self.adapters) or 'none'}")
        if self._spec is None:
            raise BackendError("chat backend: switching adapters needs a backend built from options (class, kwargs)")
        kwargs = dict(self._kwargs)
        if name is not None:
            kwargs[self._model_field] = name
        self.chat_model = load_chat_model(self._spec, kwargs)
        self.active_adapter = name

    @property
    def context_window(self) -> int:
        return self._context_window

    def _count(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(encode_text(self.tokenizer, text))
        return len(text.split())

    def count_tokens(self, chat: Chat) -> int:
        return sum(self._count(m["content"]) + 4 for m in chat)

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Completion]:
        start = time.perf_counter()
        batch = [_to_langchain(chat, self.tokenizer) for chat in prompts]
        kwargs: dict[str, Any] = {"stop": list(params.stop)} if params.stop else {}
        if params.logprobs:  # the adapter probe's request: in OpenAI's names, which a vLLM server answers
            kwargs.update(logprobs=True, temperature=params.temperature, max_tokens=params.max_new_tokens)
        try:
            replies = self.chat_model.batch(batch, config={"max_concurrency": self.max_concurrency}, **kwargs)
        except Exception as exc:  # noqa: BLE001 -- each provider's client raises its own types for a failed request
            where = redact_text(str(self._kwargs.get("base_url") or "its server"))
            raise BackendError(
                f"chat backend: the chat model ({self._spec or type(self.chat_model).__name__}) at {where} failed: "
                f"{type(exc).__name__}: {exc}. A run stops here with every finished episode stored; `agent-runtime "
                "run --resume` continues it once the server answers"
            ) from None
        elapsed = time.perf_counter() - start
        out = []
        for chat, reply in zip(prompts, replies):
            text = reply.content if isinstance(reply.content, str) else str(reply.content)
            text, _ = apply_stop(text, params.stop)
            usage = getattr(reply, "usage_metadata", None) or {}
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] if self.tokenizer is not None else []
            out.append(
                Completion(
                    text=text,
                    token_ids=ids,
                    logprobs=_token_logprobs(reply) if params.logprobs else None,
                    prompt_tokens=usage.get("input_tokens") or self.count_tokens(chat),
                    completion_tokens=usage.get("output_tokens") or (len(ids) if ids else self._count(text)),
                    prompt_text="\n".join(f"<{m['role']}> {m['content']}" for m in chat),
                    latency_s=elapsed,
                )
            )
        self.stats.record(out, elapsed)
        return out

    def choose(self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams) -> list[Completion]:
        """Choice mode for a remote chat model: its free reply, mapped to the closest admissible action
        (`closest_action`). The model's distribution over the set is not observable through a chat API, so
        `choice_logprobs` stays None and OPCD cannot distil these steps' choice policy (nor can the actions be
        scored over their shared prefixes, as the transformers backend scores them)."""
        out = self.generate(prompts, params)
        for completion, options in zip(out, choices):
            completion.text = closest_action(completion.text, options)
        return out

    def close(self) -> None:
        pass
