"""A stand-in for the edge we cannot run here: a vLLM server's dynamic-LoRA endpoint and its chat completions.

`LoraEndpoint` is a real HTTP server on 127.0.0.1 that implements vLLM's `POST /v1/load_lora_adapter` (200 on
the first load of a name, 400 "already been loaded" after, 400 on a missing path) and records every request.
`ServedModelChat` is a LangChain chat model whose reply names the served model it was built for, so a test can
see which adapter answered.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult


class ServedModelChat(BaseChatModel):
    model: str = "base"
    base_url: str | None = None

    @property
    def _llm_type(self) -> str:
        return "served-model-echo"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=f"\\boxed{{-1}} from {self.model}"))])


class LoraEndpoint:
    def __init__(self):
        self.requests: list[dict] = []
        self.loaded: dict[str, str] = {}
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
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
