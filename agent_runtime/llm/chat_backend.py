"""The `chat` policy backend: any langchain-core `BaseChatModel` as the acting policy or the lesson extractor.

This is how a remote model is used: an OpenAI-compatible client pointed at a vLLM server (`langchain_openai:
ChatOpenAI` with `base_url`), a hosted API, or anything else with a LangChain chat model. A batch is sent
with `BaseChatModel.batch` (concurrent requests, `max_concurrency` from the options). Remote APIs give no
logprobs and usually no token ids: token counts come from the response's usage metadata when the provider
reports it, else from `tokenizer` (a model name for the local tokenizer) when configured, else a word count.
Sampling parameters other than `stop` belong to the chat model's own constructor (providers name them
differently), so `temperature` etc. go in `options.kwargs`.

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
import time
from typing import Any

from agent_runtime.llm.base import BackendError, BackendStats, Chat, Completion, SamplingParams, apply_stop


def _to_langchain(chat: Chat) -> list:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    kinds = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    try:
        return [kinds[m["role"]](content=m["content"]) for m in chat]
    except KeyError as exc:
        raise BackendError(f"chat backend: unknown message role {exc}; accepted: system, user, assistant") from None


def load_chat_model(spec: str, kwargs: dict[str, Any]):
    """Instantiate `module:Class(**kwargs)`, checking that it is a LangChain chat model."""
    from langchain_core.language_models import BaseChatModel

    if ":" not in spec:
        raise BackendError(f"chat backend: options.class must look like 'package.module:ClassName', got {spec!r}")
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendError(f"chat backend: cannot load {spec!r}: {exc}") from None
    model = cls(**kwargs)
    if not isinstance(model, BaseChatModel):
        raise BackendError(f"chat backend: {spec} is not a langchain-core BaseChatModel")
    return model


class ChatBackend:
    name = "chat"

    def __init__(self, chat_model, *, context_window: int = 32768, max_concurrency: int = 8,
                 tokenizer=None):
        self.chat_model = chat_model
        self._context_window = context_window
        self.max_concurrency = max_concurrency
        self.tokenizer = tokenizer
        self.stats = BackendStats()

    @classmethod
    def from_options(cls, options: dict[str, Any], *, context_window: int | None = None) -> ChatBackend:
        options = dict(options)
        spec = options.pop("class", None)
        if not spec:
            raise BackendError("the chat backend needs model.options.class, e.g. langchain_openai:ChatOpenAI")
        model = load_chat_model(spec, options.pop("kwargs", {}))
        tokenizer = None
        if options.get("tokenizer"):
            from transformers import AutoTokenizer

            from agent_runtime.models import resolve_model

            tokenizer = AutoTokenizer.from_pretrained(resolve_model(options.pop("tokenizer")))
        unknown = set(options) - {"max_concurrency"}
        if unknown:
            raise BackendError(f"chat backend: unknown option(s) {', '.join(sorted(unknown))}; "
                               "accepted: class, kwargs, max_concurrency, tokenizer")
        return cls(model, context_window=context_window or 32768,
                   max_concurrency=options.get("max_concurrency", 8), tokenizer=tokenizer)

    @property
    def context_window(self) -> int:
        return self._context_window

    def _count(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return len(text.split())

    def count_tokens(self, chat: Chat) -> int:
        return sum(self._count(m["content"]) + 4 for m in chat)

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Completion]:
        start = time.perf_counter()
        batch = [_to_langchain(chat) for chat in prompts]
        kwargs = {"stop": list(params.stop)} if params.stop else {}
        replies = self.chat_model.batch(batch, config={"max_concurrency": self.max_concurrency}, **kwargs)
        elapsed = time.perf_counter() - start
        out = []
        for chat, reply in zip(prompts, replies):
            text = reply.content if isinstance(reply.content, str) else str(reply.content)
            text, _ = apply_stop(text, params.stop)
            usage = getattr(reply, "usage_metadata", None) or {}
            ids = (self.tokenizer(text, add_special_tokens=False)["input_ids"] if self.tokenizer is not None else [])
            out.append(Completion(
                text=text, token_ids=ids,
                prompt_tokens=usage.get("input_tokens") or self.count_tokens(chat),
                completion_tokens=usage.get("output_tokens") or (len(ids) if ids else self._count(text)),
                prompt_text="\n".join(f"<{m['role']}> {m['content']}" for m in chat),
                latency_s=elapsed,
            ))
        self.stats.record(out, elapsed)
        return out

    def close(self) -> None:
        pass
