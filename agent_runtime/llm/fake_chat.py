"""Stand-ins for the remote services a chat backend talks to, shipped for tests and demos.

What:
- `LessonWriter`: a LangChain chat model (langchain-core's own `FakeListChatModel`) that always writes
  the same experience item; name it as `lessons.extractor` ("agent_runtime.llm.fake_chat:LessonWriter")
  to run the EXTRACT phase without a model.
- `ServedModelChat`: a LangChain chat model whose reply names the served model it was built for, so a
  test can see which adapter answered (the chat backend's `model` field is the served LoRA's name).
- `LoraEndpoint`: a real HTTP server on 127.0.0.1 implementing vLLM's `POST /v1/load_lora_adapter`
  (200 on the first load of a name, 400 "already been loaded" after, 400 on a missing path) and its
  `GET /v1/models` (each loaded LoRA with the path it came from as `root`), recording every request.

Why in the package: these are named by import path in run configs (`lessons.extractor`,
`runtime.ray.server.class`), and Ray workers import them by that path, so they must be importable
wherever the runtime is installed, not only from a test checkout. Nothing calls them at runtime.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field


class LessonWriter(FakeListChatModel):
    """A fake extractor that always writes the same experience item."""

    responses: list[str] = Field(
        default_factory=lambda: ["- EXPERIENCE ITEM: Always take the coin before anything else."]
    )


class ServedModelChat(BaseChatModel):
    """Answers every chat with a boxed -1 and the name of the served model it was built for."""

    model: str = "base"
    base_url: str | None = None

    @property
    def _llm_type(self) -> str:
        return "served-model-echo"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=f"\\boxed{{-1}} from {self.model}"))])


class LoraEndpoint:
    """vLLM's dynamic-LoRA endpoint on a free localhost port (`url`, ending in /v1); `close()` stops it."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.loaded: dict[str, str] = {}
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                endpoint.requests.append({"path": self.path})
                if self.path != "/v1/models":
                    return self._reply(404, "not found")
                served = [{"id": name, "object": "model", "root": path} for name, path in endpoint.loaded.items()]
                return self._reply(200, json.dumps({"object": "list", "data": served}))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append({"path": self.path, **body})
                if self.path != "/v1/load_lora_adapter":
                    return self._reply(404, "not found")
                name, path = body["lora_name"], body["lora_path"]
                if name in endpoint.loaded:
                    return self._reply(400, f"The lora adapter '{name}' has already been loaded.")
                if not (Path(path) / "adapter_config.json").is_file():
                    return self._reply(400, f"No adapter found for {path}")
                endpoint.loaded[name] = path
                return self._reply(200, f"Success: LoRA adapter '{name}' added successfully.")

            def _reply(self, code: int, text: str) -> None:
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
